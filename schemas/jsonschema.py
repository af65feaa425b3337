"""The JSON Schema of the wire format, generated from the Structs and checked in under
``jsonschema/`` so hosts in any language can validate what they produce."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Union

import msgspec

from memstream.schemas.events import DECISION_TYPES, EVENT_TYPES

SCHEMA_PATH = Path(__file__).parent / "jsonschema" / "memstream.v1.json"


def render() -> str:
    events = msgspec.json.schema(Union[EVENT_TYPES])  # type: ignore[valid-type]
    decisions = msgspec.json.schema(Union[DECISION_TYPES])  # type: ignore[valid-type]
    doc = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "memstream wire format v1",
        "description": "Records on memstream.events (EventRecord) and memstream.decisions "
                       "(DecisionRecord): UTF-8 JSON, key = user_id.",
        "$defs": {**events.get("$defs", {}), **decisions.get("$defs", {}),
                  "EventRecord": {k: v for k, v in events.items() if k != "$defs"},
                  "DecisionRecord": {k: v for k, v in decisions.items() if k != "$defs"}},
        "oneOf": [{"$ref": "#/$defs/EventRecord"}, {"$ref": "#/$defs/DecisionRecord"}],
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"
