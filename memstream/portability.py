"""Portability: a user's log as a documented, versioned archive, and back into a deployment.

The archive is JSON Lines, UTF-8. Line 1 is the header::

    {"format": "memstream-export", "version": 1, "user_id": ..., "exported_at": ...,
     "events_topic": ..., "decisions_topic": ..., "events": N, "decisions": M,
     "left_out": {"forgotten": F, "not_theirs": U}}

then one line per record, in log order, events first::

    {"log": "events" | "decisions", "offset": <offset in the source log>, "record": {...}}

where ``record`` is the record's own JSON (the wire format of ``schemas/jsonschema``), opened.
Left out (and counted): records shredded by a forget of the user, the forgets of the whole user
(they name this deployment's key generations), and the records of their partition keyed by them
that are not theirs (a poison record, dead-lettered where it was met, and formation's marker
after it, which names no user). The file is made readable by its
owner only.
Every event keyed by the user and every decision about them is there: turns, commands, and
what formation decided (with embeddings), so an import never calls an LLM or the embedder.

Import appends the events to the target's events topic (keyed by the user, so on their
partition) marked ``memstream.imported``, which formation passes without deciding, then the
decisions with their ``source`` positions remapped to where the events landed. The user's
projections in the target then equal the source's row for row, except the episodes' source
partition and offset (the remapped positions). Every record is sealed again with the target's
data keys; a record naming another user, a decision not made from an event of the archive, or
one undecodable, goes to the target's dead-letter topic. Every line is checked before the first
record is appended; refused whole: an archive holding a record too big for any topic or a forget
of the whole user, one exported before the user's last forget in the target (``force`` imports
it), and one for a user the target already remembers (``merge`` imports it).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from aiokafka import TopicPartition

from memstream.projections import db
from memstream.read_client.arguments import check_user
from memstream.schemas import InvalidEvent, LogPosition, NothingDecided, decode_decision, decode_event
from memstream.schemas.codec import check_size
from memstream.schemas.errors import InvalidArgument
from memstream.schemas.events import MAX_DECISION_BYTES, ends_user
from memstream.streams.log.screening import IMPORTED, expected_partition
from memstream.streams.log.kafka_util import drain, groupless_consumer, partitions_of
from memstream.streams.log.producer import idempotent_producer
from memstream.streams.log.sealing import sealer_for

log = logging.getLogger("memstream.portability")

FORMAT, VERSION = "memstream-export", 1


async def _each(consumer, topic: str, partition: int, key: bytes, on_progress, each) -> None:
    """``await each(batch)`` for the records under ``key`` of ``topic``'s ``partition``, from its
    start, a batch at a time (an export holds one batch, not the user's log)."""
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    high = await consumer.end_offsets([tp])

    async def mine(batch) -> None:
        if theirs := [r for r in batch if r.key == key]:
            await each(theirs)
        on_progress(batch[-1].offset + 1, high[tp])

    await drain(consumer, [tp], high, mine)


async def _forgotten_at(consumer, topic: str, partition: int, key: bytes, user_id: str, decode) -> int:
    """The offset of ``user_id``'s last whole-user forget on ``topic`` (-1: none): a first pass
    that opens nothing (a forget stays plain on the log)."""
    cut = [-1]

    async def look(batch) -> None:
        cut[0] = max(cut[0], _last_forget(batch, decode, user_id))

    await _each(consumer, topic, partition, key, lambda done, total: None, look)
    return cut[0]


async def export_user(settings, user_id: str, path: Path, on_progress=None) -> dict:
    """Write ``user_id``'s events and decisions to ``path``, opened; returns the header.
    ``on_progress(done, total)``: records of the user's partition read, per topic. Two passes
    over each topic: where the user was last forgotten, then each record opened and written a
    batch at a time (what is held is a batch and the ids of turns said before the forget)."""
    check_user(user_id)
    on_progress = on_progress or (lambda done, total: None)
    key = user_id.encode()
    # Before the log is read: an import compares it with the user's last forget, and one said
    # while this export reads must make the archive older than it.
    exported_at = datetime.now(timezone.utc)
    left_out = {"forgotten": 0, "not_theirs": 0}
    counted = {"events": 0, "decisions": 0}
    # What the user said before their last forget is not theirs to take along, though it may
    # still open: formation has not destroyed its key yet, or it was written before sealing.
    said_before: set = set()
    # The archive is the user's words in plaintext: readable by its owner only, like the keys
    # (made beside ``path`` and moved over it whole: an existing file is never left half-written).
    path = Path(path)
    pool = await db.create_pool(settings.dsn(), settings.postgres_schema, min_size=0, max_size=1)
    try:
        sealer = await sealer_for(settings, pool)
        fd, body = tempfile.mkstemp(prefix=f".{path.name}.body.", dir=path.parent)  # 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                async with groupless_consumer(settings.kafka_bootstrap, auto_offset_reset="earliest") as consumer:
                    n = len(await partitions_of(consumer, settings.events_topic))
                    if not n:
                        raise InvalidArgument(f"no events topic {settings.events_topic!r}")
                    partition = expected_partition(key, n)
                    for name, topic, decode in (("events", settings.events_topic, decode_event),
                                                ("decisions", settings.decisions_topic, decode_decision)):
                        cut = await _forgotten_at(consumer, topic, partition, key, user_id, decode)

                        async def write(batch, name=name, decode=decode, cut=cut) -> None:
                            for m in await sealer.open(batch):
                                why, record = _left_out(decode, m, user_id)
                                if why is None and (m.offset < cut or (
                                        name == "decisions" and record.source_event_id in said_before)):
                                    why = "forgotten"
                                    if name == "events":
                                        said_before.add(record.event_id)
                                if why is not None:
                                    left_out[why] += 1
                                    continue
                                out.write(json.dumps({"log": name, "offset": m.offset,
                                                      "record": json.loads(m.value)}) + "\n")
                                counted[name] += 1

                        await _each(consumer, topic, partition, key, on_progress, write)
            header = {"format": FORMAT, "version": VERSION, "user_id": user_id,
                      "exported_at": exported_at.isoformat(), "events_topic": settings.events_topic,
                      "decisions_topic": settings.decisions_topic, "events": counted["events"],
                      "decisions": counted["decisions"], "left_out": left_out}
            fd, made = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f, open(body, encoding="utf-8") as b:
                    f.write(json.dumps(header) + "\n")
                    shutil.copyfileobj(b, f, 1 << 20)
                os.replace(made, path)
            except BaseException:
                Path(made).unlink(missing_ok=True)
                raise
        finally:
            Path(body).unlink(missing_ok=True)
    finally:
        await pool.close()
    log.info("exported %d events and %d decisions of a user to %s (%d not theirs left out)", counted["events"],
             counted["decisions"], path, left_out["not_theirs"])
    return header


def _last_forget(msgs, decode, user_id: str) -> int:
    """The offset of the last whole-user forget of ``user_id`` among ``msgs`` (-1: none); one
    naming another user under their key is dead-lettered where it was met, and ends nothing."""
    for m in reversed(msgs):
        if m.sealing is None:
            try:
                if ends_user(record := decode(m.value or b"")) and record.user_id == user_id:
                    return m.offset
            except InvalidEvent:
                pass
    return -1


def _left_out(decode, m, user_id: str) -> tuple[str | None, object]:
    """Why the archive leaves ``m`` out (None: it keeps it), and ``m`` decoded (None if it is
    not). What was said before a forget of the user is
    shredded: not theirs to take along any more. The forgets themselves stay behind: they name
    this deployment's key generations, which in another deployment would end keys that have
    nothing to do with them. A record the log kept that is not one of the user's (a poison record,
    dead-lettered where it was met) must not stop their export for good."""
    if m.sealing is not None:
        return "forgotten", None
    try:
        record = decode(m.value or b"")
    except InvalidEvent:
        return "not_theirs", None
    return ("forgotten" if ends_user(record) else None if record.user_id == user_id else "not_theirs"), record


def _when(text) -> datetime | None:
    try:
        made = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return made if made.tzinfo is not None else None


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


class _Plan(msgspec.Struct):
    """What an import will append, all checked before the first record is: an archive that fails
    halfway would leave events whose decisions never come (formation passes imported events)."""

    events: list = []
    decisions: list = []
    letters: list = []  # (raw, line offset, why)


def _plan(path: Path, user: str, events: list[dict], decisions: list[dict]) -> _Plan:
    plan, kept = _Plan(), set()
    for x in events:
        raw = msgspec.json.encode(x["record"])  # as the log holds it: compact UTF-8, not json's \\u escapes
        try:
            check_size(raw)  # no topic takes it, not even the dead letters'
        except InvalidEvent as exc:
            raise InvalidArgument(f"{path}: the event at offset {x['offset']}: {exc}") from None
        try:
            event = decode_event(raw)
        except InvalidEvent as exc:
            plan.letters.append((raw, x["offset"], f"undecodable event: {exc}"))
            continue
        if ends_user(event):  # export leaves them out: they end this deployment's keys
            raise InvalidArgument(f"{path}: the event at offset {x['offset']} forgets the whole user; an export "
                                  "never holds one (forget the user here with forget-user)")
        if event.user_id != user:
            plan.letters.append((raw, x["offset"], f"names user {event.user_id!r}, not the archive's"))
            continue
        plan.events.append(event)
        kept.add(event.event_id)
    for x in decisions:
        raw = msgspec.json.encode(x["record"])
        try:
            check_size(raw, MAX_DECISION_BYTES)  # formation makes none bigger
        except InvalidEvent as exc:
            raise InvalidArgument(f"{path}: the decision at offset {x['offset']}: {exc}") from None
        try:
            d = decode_decision(raw)
        except InvalidEvent as exc:
            plan.letters.append((raw, x["offset"], f"undecodable decision: {exc}"))
            continue
        if ends_user(d):
            raise InvalidArgument(f"{path}: the decision at offset {x['offset']} forgets the whole user; an export "
                                  "never holds one")
        if d.source_event_id not in kept and isinstance(d, NothingDecided):
            continue  # a marker after a record left out: the target's formation writes its own
        # A decision is about the user of the event it was made from, and only theirs: the
        # projections trust its user (a forget deletes by it).
        why = (f"names user {d.user_id!r}, not the archive's" if d.user_id != user
               else f"names event {d.source_event_id}, not an event of the archive"
               if d.source_event_id not in kept else None)
        if why is not None:
            plan.letters.append((raw, x["offset"], why))
        else:
            plan.decisions.append(d)
    return plan


async def _holds(pool, user: str) -> bool:
    """Whether the target remembers anything of ``user`` already."""
    return await pool.fetchval("SELECT EXISTS (SELECT 1 FROM episodes WHERE user_id = $1) "
                               "OR EXISTS (SELECT 1 FROM memory_facts WHERE user_id = $1) "
                               "OR EXISTS (SELECT 1 FROM memory_edges WHERE user_id = $1)", user)


async def import_user(settings, path: Path, on_progress=None, *, force: bool = False, merge: bool = False) -> dict:
    """Append an archive's events and decisions to ``settings``' topics; returns the counts.
    ``on_progress(done, total)``: records appended. Refused before anything is appended: an
    archive with a record no topic takes or that forgets the whole user; one made before the
    user's last forget here, unless ``force`` (it would bring back what they asked to forget);
    and a user the target already remembers, unless ``merge`` (two people may share an id
    across deployments; a re-run after a failed import merges with what it appended)."""
    header, events, decisions = read_archive(path)
    on_progress = on_progress or (lambda done, total: None)
    user = header["user_id"]
    # Only the archive's user's records go onto the target's log; one naming another user, or one
    # the source dead-lettered, goes to the target's dead-letter topic (its plaintext window)
    # with the reason — never plain onto the events topic, which keeps records forever.
    plan = _plan(path, user, events, decisions)
    total = len(plan.events) + len(plan.decisions) + len(plan.letters)
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
        if not merge and await _holds(pool, user):
            raise InvalidArgument(f"{user!r} already has memory here: importing {path} would merge it with theirs; "
                                  "--merge if they are the same person (or this import ran before)")
        done = 0
        for raw, offset, why in plan.letters:
            await (await producer.send(settings.dead_letter_topic, raw, key=user.encode(), headers=[
                ("memstream.reason", f"import of {path.name}: {why}".encode()[:4096]),
                ("memstream.stage", b"import"), ("memstream.source", f"{path.name}/{offset}".encode())]))
            done += 1
            on_progress(done, total)
        # Decisions find their event by its id, not its offset: a log moved by ``partitions grow``
        # kept its old decisions as they were, naming offsets of the old topic.
        moved: dict[object, LogPosition] = {}  # event id -> where it landed
        for event in plan.events:
            meta = await (await producer.send(settings.events_topic, await sealer.seal(event), key=user.encode(),
                                              headers=[(IMPORTED, b"1")]))
            moved[event.event_id] = LogPosition(settings.events_topic, meta.partition, meta.offset)
            done += 1
            on_progress(done, total)
        futures = []
        for d in plan.decisions:
            where = moved[d.source_event_id]
            futures.append(await producer.send(settings.decisions_topic,
                                               await sealer.seal(msgspec.structs.replace(d, source=where)),
                                               key=user.encode(), partition=where.partition))
            done += 1
            on_progress(done, total)
        for f in futures:
            await f
    finally:
        await producer.stop()
        await pool.close()
    log.info("imported %d events and %d decisions of a user from %s (%d dead-lettered)", len(moved),
             len(futures), path, len(plan.letters))
    return {"user_id": user, "events": len(moved), "decisions": len(futures), "dead_lettered": len(plan.letters)}
