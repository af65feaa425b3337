"""Portability: a user's log as a documented, versioned archive, and back into a deployment.

The archive is JSON Lines, UTF-8. Line 1 is the header::

    {"format": "memstream-export", "version": 1, "user_id": ..., "exported_at": ...,
     "events_topic": ..., "decisions_topic": ..., "events": N, "decisions": M}

then one line per record, in log order, events first::

    {"log": "events" | "decisions", "offset": <offset in the source log>, "record": {...}}

where ``record`` is the record's own JSON (the wire format of ``schemas/jsonschema``), opened
(records shredded by a forget of the user are left out).
Every event keyed by the user and every decision about them is there: turns, commands, and
what formation decided (with embeddings), so an import never calls an LLM or the embedder.

Import appends the events to the target's events topic (keyed by the user, so on their
partition) marked ``memstream.imported``, which formation passes without deciding, then the
decisions with their ``source`` positions remapped to where the events landed. The user's
projections in the target then equal the source's row for row, except the episodes' source
partition and offset (the remapped positions). Every record is sealed again with the target's
data keys.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path

import msgspec
from aiokafka import TopicPartition

from memstream.projections import db
from memstream.schemas import InvalidEvent, LogPosition, decode_decision, decode_event
from memstream.schemas.errors import InvalidArgument
from memstream.sealing import data_keys
from memstream.streams.admission import IMPORTED, expected_partition
from memstream.streams.kafka_util import drain, groupless_consumer, partitions_of
from memstream.streams.producer import idempotent_producer
from memstream.streams.sealing import RecordSealer

log = logging.getLogger("memstream.portability")

FORMAT, VERSION = "memstream-export", 1


async def _read(consumer, topic: str, partition: int, key: bytes) -> list:
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    out = []

    async def keep(batch) -> None:
        out.extend(r for r in batch if r.key == key)

    await drain(consumer, [tp], await consumer.end_offsets([tp]), keep)
    return out


async def _sealer(settings, pool) -> RecordSealer:
    return RecordSealer(await data_keys(settings, pool), seal=settings.seal_records)


async def export_user(settings, user_id: str, path: Path) -> dict:
    """Write ``user_id``'s events and decisions to ``path``, opened; returns the header."""
    key = user_id.encode()
    pool = await db.create_pool(settings.dsn(), settings.postgres_schema, min_size=0, max_size=1)
    try:
        sealer = await _sealer(settings, pool)
        async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest") as consumer:
            n = len(await partitions_of(consumer, settings.events_topic))
            if not n:
                raise InvalidArgument(f"no events topic {settings.events_topic!r}")
            partition = expected_partition(key, n)
            events = await sealer.open(await _read(consumer, settings.events_topic, partition, key))
            decisions = await sealer.open(await _read(consumer, settings.decisions_topic, partition, key))
    finally:
        await pool.close()
    # What was said before a forget of the user is shredded: not theirs to take along any more.
    events, decisions = ([m for m in msgs if m.sealing is None] for msgs in (events, decisions))
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


def read_archive(path: Path) -> tuple[dict, list[dict], list[dict]]:
    """The header, events and decisions of an archive, checked."""
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines or lines[0].get("format") != FORMAT:
        raise InvalidArgument(f"{path} is not a memstream export")
    header = lines[0]
    if header.get("version") != VERSION:
        raise InvalidArgument(f"{path} is a version {header.get('version')} export; this build reads version {VERSION}")
    events = [x for x in lines[1:] if x["log"] == "events"]
    decisions = [x for x in lines[1:] if x["log"] == "decisions"]
    if (len(events), len(decisions)) != (header["events"], header["decisions"]):
        raise InvalidArgument(f"{path} is truncated: the header counts {header['events']} events and "
                              f"{header['decisions']} decisions, the file holds {len(events)} and {len(decisions)}")
    return header, events, decisions


async def import_user(settings, path: Path) -> dict:
    """Append an archive's events and decisions to ``settings``' topics; returns the counts."""
    header, events, decisions = read_archive(path)
    # Every record goes under the archive's user key: one naming another user inside (or one the
    # source dead-lettered) is dead-lettered again by the target's admission, never applied.
    user = header["user_id"]
    producer = idempotent_producer(settings.kafka_bootstrap)
    await producer.start()
    pool = await db.create_pool(settings.dsn(), settings.postgres_schema, min_size=0, max_size=1)
    try:
        sealer = await _sealer(settings, pool)  # sealed again, with the target's keys
        moved: dict[int, LogPosition] = {}
        for x in events:
            raw = json.dumps(x["record"]).encode()
            try:
                value = await sealer.seal(decode_event(raw))
            except InvalidEvent:
                value = raw  # the target's admission dead-letters it, as the source's did
            meta = await (await producer.send(settings.events_topic, value, key=user.encode(),
                                              headers=[(IMPORTED, b"1")]))
            moved[x["offset"]] = LogPosition(settings.events_topic, meta.partition, meta.offset)
        futures = []
        for x in decisions:
            d = decode_decision(json.dumps(x["record"]).encode())
            if d.source.offset not in moved:
                raise InvalidArgument(f"{path}: a decision names event offset {d.source.offset}, not in the archive")
            where = moved[d.source.offset]
            d = msgspec.structs.replace(d, source=where)
            futures.append(await producer.send(settings.decisions_topic, await sealer.seal(d), key=user.encode(),
                                               partition=where.partition))
        for f in futures:
            await f
    finally:
        await producer.stop()
        await pool.close()
    log.info("imported %d events and %d decisions of a user from %s", len(events), len(decisions), path)
    return {"user_id": user, "events": len(events), "decisions": len(decisions)}
