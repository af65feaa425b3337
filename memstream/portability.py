"""Portability: a user's log as a documented, versioned archive, and back into a deployment.

The archive is JSON Lines, UTF-8. Line 1 is the header::

    {"format": "memstream-export", "version": 1, "user_id": ..., "exported_at": ...,
     "events_topic": ..., "decisions_topic": ..., "events": N, "decisions": M}

then one line per record, in log order, events first::

    {"log": "events" | "decisions", "offset": <offset in the source log>, "record": {...}}

where ``record`` is the record's own JSON (the wire format of ``schemas/jsonschema``), opened.
Left out: records shredded by a forget of the user, and the forgets of the whole user (they
name this deployment's key generations).
Every event keyed by the user and every decision about them is there: turns, commands, and
what formation decided (with embeddings), so an import never calls an LLM or the embedder.

Import appends the events to the target's events topic (keyed by the user, so on their
partition) marked ``memstream.imported``, which formation passes without deciding, then the
decisions with their ``source`` positions remapped to where the events landed. The user's
projections in the target then equal the source's row for row, except the episodes' source
partition and offset (the remapped positions). Every record is sealed again with the target's
data keys; a record naming another user, a decision not made from an event of the archive, or
one undecodable, goes to the target's dead-letter topic. An archive exported before the user's
last forget in the target is refused (``force`` imports it).
"""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from aiokafka import TopicPartition

from memstream.projections import db
from memstream.read_client.arguments import check_user
from memstream.schemas import InvalidEvent, LogPosition, NothingDecided, decode_decision, decode_event
from memstream.schemas.errors import InvalidArgument
from memstream.streams.admission import IMPORTED, expected_partition
from memstream.streams.kafka_util import drain, groupless_consumer, partitions_of
from memstream.streams.producer import idempotent_producer
from memstream.streams.sealing import sealer_for

log = logging.getLogger("memstream.portability")

FORMAT, VERSION = "memstream-export", 1


async def _read(consumer, topic: str, partition: int, key: bytes, on_progress) -> list:
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    out, high = [], await consumer.end_offsets([tp])

    async def keep(batch) -> None:
        out.extend(r for r in batch if r.key == key)
        on_progress(batch[-1].offset + 1, high[tp])

    await drain(consumer, [tp], high, keep)
    return out


async def export_user(settings, user_id: str, path: Path, on_progress=None) -> dict:
    """Write ``user_id``'s events and decisions to ``path``, opened; returns the header.
    ``on_progress(done, total)``: records of the user's partition read, per topic."""
    check_user(user_id)
    on_progress = on_progress or (lambda done, total: None)
    key = user_id.encode()
    pool = await db.create_pool(settings.dsn(), settings.postgres_schema, min_size=0, max_size=1)
    try:
        sealer = await sealer_for(settings, pool)
        async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest") as consumer:
            n = len(await partitions_of(consumer, settings.events_topic))
            if not n:
                raise InvalidArgument(f"no events topic {settings.events_topic!r}")
            partition = expected_partition(key, n)
            events = await sealer.open(await _read(consumer, settings.events_topic, partition, key, on_progress))
            decisions = await sealer.open(await _read(consumer, settings.decisions_topic, partition, key, on_progress))
    finally:
        await pool.close()
    # What was said before a forget of the user is shredded: not theirs to take along any more.
    # The forgets themselves stay behind: they name this deployment's key generations, which in
    # another deployment would end keys that have nothing to do with them.
    events, decisions = ([m for m in msgs if m.sealing is None and not _forgets_user(m.value)]
                         for msgs in (events, decisions))
    header = {"format": FORMAT, "version": VERSION, "user_id": user_id,
              "exported_at": datetime.now(timezone.utc).isoformat(), "events_topic": settings.events_topic,
              "decisions_topic": settings.decisions_topic, "events": len(events), "decisions": len(decisions)}
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for name, msgs in (("events", events), ("decisions", decisions)):
            for m in msgs:
                f.write(json.dumps({"log": name, "offset": m.offset, "record": json.loads(m.value)}) + "\n")
    log.info("exported %d events and %d decisions of a user to %s", len(events), len(decisions), path)
    return header


def _when(text) -> datetime | None:
    try:
        made = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return made if made.tzinfo is not None else None


def _forgets_user(value: bytes | None) -> bool:
    try:
        head = msgspec.json.decode(value or b"")
    except msgspec.DecodeError:
        return False
    return isinstance(head, dict) and (head.get("type") == "UserForgotten" or (
        head.get("type") == "MemoryForgotten" and head.get("kind") == "user"))


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    log: Literal["events", "decisions"]
    offset: Annotated[int, msgspec.Meta(ge=0)]
    record: dict


def read_archive(path: Path) -> tuple[dict, list[dict], list[dict]]:
    """The header, events and decisions of an archive, checked."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"{path} is not a memstream export: {type(exc).__name__}: {exc}") from None
    if not lines or not isinstance(lines[0], dict) or lines[0].get("format") != FORMAT:
        raise InvalidArgument(f"{path} is not a memstream export")
    header = lines[0]
    if header.get("version") != VERSION:
        raise InvalidArgument(f"{path} is a version {header.get('version')} export; this build reads version {VERSION}")
    check_user(header.get("user_id"))
    try:
        for x in lines[1:]:
            msgspec.convert(x, _Line)
    except msgspec.ValidationError as exc:
        raise InvalidArgument(f"{path}: a record line is not {{log, offset, record}}: {exc}") from None
    events = [x for x in lines[1:] if x["log"] == "events"]
    decisions = [x for x in lines[1:] if x["log"] == "decisions"]
    if (len(events), len(decisions)) != (header.get("events"), header.get("decisions")):
        raise InvalidArgument(f"{path} is truncated: the header counts {header.get('events')} events and "
                              f"{header.get('decisions')} decisions, the file holds {len(events)} and {len(decisions)}")
    return header, events, decisions


async def import_user(settings, path: Path, on_progress=None, *, force: bool = False) -> dict:
    """Append an archive's events and decisions to ``settings``' topics; returns the counts.
    ``on_progress(done, total)``: records appended. An archive made before the user's last forget
    here is refused unless ``force``: it would bring back what they asked to forget."""
    header, events, decisions = read_archive(path)
    on_progress = on_progress or (lambda done, total: None)
    total = len(events) + len(decisions)
    # Only the archive's user's records go onto the target's log; one naming another user, or one
    # the source dead-lettered, goes to the target's dead-letter topic (its plaintext window)
    # with the reason — never plain onto the events topic, which keeps records forever.
    user = header["user_id"]
    producer = idempotent_producer(settings.kafka_bootstrap)
    await producer.start()
    pool = await db.create_pool(settings.dsn(), settings.postgres_schema, min_size=0, max_size=1)
    try:
        sealer = await sealer_for(settings, pool)  # sealed again, with the target's keys
        if not force and (forgot := (await sealer.last_forgets({user})).get(user)) is not None:
            made = _when(header.get("exported_at"))
            if made is None or made.timestamp() <= forgot:
                raise InvalidArgument(
                    f"{user!r} was forgotten here at {datetime.fromtimestamp(forgot, timezone.utc).isoformat()}, "
                    f"after {path} was exported ({header.get('exported_at')!r}): importing it would bring back what "
                    "they asked to forget; --force if they ask for it")

        letters = 0

        async def letter(raw: bytes, offset: int, why: str) -> None:
            nonlocal letters
            letters += 1
            await (await producer.send(settings.dead_letter_topic, raw, key=user.encode(), headers=[
                ("memstream.reason", f"import of {path.name}: {why}".encode()[:4096]),
                ("memstream.stage", b"import"), ("memstream.source", f"{path.name}/{offset}".encode())]))

        # Decisions find their event by its id, not its offset: a log moved by ``partitions grow``
        # kept its old decisions as they were, naming offsets of the old topic.
        moved: dict[object, LogPosition] = {}  # event id -> where it landed
        for x in events:
            raw = json.dumps(x["record"]).encode()
            try:
                event = decode_event(raw)
                why = None if event.user_id == user else f"names user {event.user_id!r}, not the archive's"
            except InvalidEvent as exc:
                why = f"undecodable event: {exc}"
            if why is not None:
                await letter(raw, x["offset"], why)
                continue
            meta = await (await producer.send(settings.events_topic, await sealer.seal(event), key=user.encode(),
                                              headers=[(IMPORTED, b"1")]))
            moved[event.event_id] = LogPosition(settings.events_topic, meta.partition, meta.offset)
            on_progress(len(moved) + letters, total)
        futures = []
        for x in decisions:
            raw = json.dumps(x["record"]).encode()
            try:
                d = decode_decision(raw)
            except InvalidEvent as exc:
                await letter(raw, x["offset"], f"undecodable decision: {exc}")
                continue
            if d.source_event_id not in moved and isinstance(d, NothingDecided):
                continue  # a marker after a record left out: the target's formation writes its own
            # A decision is about the user of the event it was made from, and only theirs: the
            # projections trust its user (a forget deletes by it).
            why = (f"names user {d.user_id!r}, not the archive's" if d.user_id != user
                   else f"names event {d.source_event_id}, not an event of the archive"
                   if d.source_event_id not in moved else None)
            if why is not None:
                await letter(raw, x["offset"], why)
                continue
            where = moved[d.source_event_id]
            d = msgspec.structs.replace(d, source=where)
            futures.append(await producer.send(settings.decisions_topic, await sealer.seal(d), key=user.encode(),
                                               partition=where.partition))
            on_progress(len(events) + len(futures), total)
        for f in futures:
            await f
    finally:
        await producer.stop()
        await pool.close()
    log.info("imported %d events and %d decisions of a user from %s (%d dead-lettered)", len(moved),
             len(futures), path, letters)
    return {"user_id": user, "events": len(moved), "decisions": len(futures), "dead_lettered": letters}
