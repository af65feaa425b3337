"""Sealed records: how a user's content sits on every retained topic.

A sealed record is ``{"type", "schema_version", "user_id", "sealed"}``: the record's own JSON,
sealed whole with the user's data key (``memstream.keys``), its type and user readable so
routing, screening and dead letters work without keys. Kept plain: records with nothing of a
person in them that must be read after their key is gone (``UserForgotten``, a user's
``MemoryForgotten``, ``NothingDecided``) and the host-wide ones of ``SYSTEM_USER``.

Opening follows the log: after a forget of generation ``g`` of a user, what was sealed for them
under ``g`` or earlier opens as shredded whatever the key store still holds, so a live worker
and a replay long after the key is gone skip the same records.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from typing import Sequence

import msgspec

from memstream.schemas import SYSTEM_USER, MemoryForgotten, NothingDecided, UserForgotten, encode
from memstream.schemas.events import ends_user
from memstream.schemas.codec import MALFORMED, decode_decision, decode_event
from memstream.schemas.errors import InvalidEvent
from memstream.keys.data_keys import DataKeys, NotSealed, Shredded, generation_of
from memstream.streams.log.records import SHREDDED, Record
from memstream.streams.log.screening import expected_partition

log = logging.getLogger("memstream.sealing")

_FORGETS = (UserForgotten.__struct_config__.tag, MemoryForgotten.__struct_config__.tag)
_PLAIN = (NothingDecided.__struct_config__.tag,)  # besides forgets and SYSTEM_USER's: never sealed


class _Envelope(msgspec.Struct):
    type: str
    user_id: str = ""
    schema_version: int = 1
    sealed: bytes | None = None  # base64 in the JSON


_envelope = msgspec.json.Decoder(_Envelope)
_encoder = msgspec.json.Encoder()


def is_sealed(value: bytes | None) -> bool:
    """Whether ``value`` is a sealed record (read as the log reads it, not by looking for a word)."""
    try:
        return _envelope.decode(value or b"").sealed is not None
    except MALFORMED:
        return False


def sealed_generation(value: bytes | None) -> int | None:
    """The key generation ``value`` is sealed under (None: not a sealed record)."""
    try:
        env = _envelope.decode(value or b"")
    except MALFORMED:
        return None
    return None if env.sealed is None else generation_of(env.sealed)


async def sealer_for(settings, pool) -> "RecordSealer":
    """The sealer of ``settings``' deployment: its data keys in ``pool``'s database."""
    from memstream.keys import data_keys

    return RecordSealer(await data_keys(settings, pool), seal=settings.seal_records)


def kept_plain(record) -> bool:
    return record.user_id == SYSTEM_USER or isinstance(record, NothingDecided) or ends_user(record)


def _context(type_name: str) -> str:
    return f"record:{type_name}"


class RecordSealer:
    """Seals records for the log and opens batches read from it. ``keys`` None or ``seal``
    False: records are written plain (records already sealed still open when ``keys`` is
    given). ``shredded`` counts the records opened as shredded; ``plain_records`` the plain
    records of users read after the deployment began sealing."""

    ENDED_KEPT = 100_000  # users whose ended generation is held; beyond, the key store answers (destroyed keys)
    SINCE_ASKED_S = 60.0  # how often a deployment that has never sealed is asked again

    def __init__(self, keys: DataKeys | None, *, seal: bool = True):
        self.keys, self._sealing = keys, seal and keys is not None
        # The events topic's partition count, where this sealer opens it: a forget there counts
        # only on its user's own partition (screening dead-letters it anywhere else).
        self.partitions: int | None = None
        # user -> the last key generation the log has ended, most recently ended last
        self._ended: OrderedDict[str, int] = OrderedDict()
        self._since: tuple[float | None, float] | None = None  # (sealing since, when asked)
        self.shredded, self.plain_records, self._plain_said = 0, 0, float("-inf")

    async def seal(self, record, generation: int | None = None) -> bytes:
        """``record`` as the log keeps it. ``generation``: the key generation of the record it was
        derived from (a decision from its turn) — sealed under that one or, when it is gone,
        ``Shredded``: what came from a forgotten record is never sealed under a newer key. A
        ``UserForgotten`` is stamped with the generation it ends (whatever a client put there)."""
        if isinstance(record, UserForgotten):
            record = msgspec.structs.replace(record, generation=await self.stamp(record))
        data = encode(record)
        if not self._sealing or kept_plain(record):
            return data
        tag = type(record).__struct_config__.tag
        blob = await self.keys.seal(record.user_id, data, _context(tag), generation)
        return _encoder.encode(_Envelope(tag, record.user_id, record.SCHEMA_VERSION, blob))

    async def stamp(self, forget: UserForgotten, at: float | None = None) -> int | None:
        """The key generation ``forget`` ends, the same however often it is asked (None: no keys);
        ``at``: when it was said (Unix seconds; default now), kept from the first time it is asked."""
        return None if self.keys is None else await self.keys.stamp(forget.user_id, forget.event_id.bytes, at)

    async def last_forgets(self, user_ids) -> dict[str, float]:
        """When each of ``user_ids`` was last forgotten (Unix seconds; none known without keys)."""
        return {} if self.keys is None or not user_ids else await self.keys.last_forgets(user_ids)

    async def open(self, records: Sequence[Record]) -> list[Record]:
        """``records`` with every sealed value opened: plain JSON, or ``sealing`` saying why not."""
        out = []
        for r in records:
            try:
                env = _envelope.decode(r.value or b"")
            except MALFORMED:
                out.append(r)  # not a record at all: its step dead-letters it
                continue
            if env.sealed is None:
                if env.type in _FORGETS:
                    await self._note_forget(env.type, r)
                elif self._sealing and env.type not in _PLAIN and env.user_id != SYSTEM_USER \
                        and await self._written_while_sealing(r.timestamp_ms):
                    self._plain_seen()
                out.append(r)
            elif self.keys is None:
                out.append(dataclasses.replace(r, sealing="sealed, and this process has no data keys"))
            else:
                out.append(await self._open(r, env))
        return out

    async def _written_while_sealing(self, timestamp_ms: int) -> bool:
        now = time.monotonic()
        if self._since is None or (self._since[0] is None and now - self._since[1] > self.SINCE_ASKED_S):
            self._since = await self.keys.sealing_since(), now
        return self._since[0] is not None and timestamp_ms / 1000 > self._since[0]

    def _plain_seen(self) -> None:
        """A plain record of a person's, written after this deployment began sealing: a process
        with MEMSTREAM_SEAL_RECORDS=false beside sealing ones, or a client writing the events
        topic by hand (supported: it cannot be told from the first). Applied as it is, but no
        forget can reach its copy on the log: said, at most once a minute (docs/erasure.md)."""
        self.plain_records += 1
        now = time.monotonic()
        if now - self._plain_said >= 60.0:
            self._plain_said = now
            log.warning("%d plain records of users written after this deployment began sealing: a forget cannot "
                        "erase them from the log (a process with MEMSTREAM_SEAL_RECORDS=false, or a client "
                        "writing the events topic instead of the ingress topic)", self.plain_records)

    def _end(self, user_id: str, generation: int) -> None:
        self._ended[user_id] = max(self._ended.pop(user_id, 0), generation)
        while len(self._ended) > self.ENDED_KEPT:
            self._ended.popitem(last=False)

    async def _open(self, r: Record, env: _Envelope) -> Record:
        try:
            generation = generation_of(env.sealed)
            if generation <= self._ended.get(env.user_id, 0):
                raise Shredded("sealed under a key the log has ended")
            value = await self.keys.open(env.user_id, env.sealed, _context(env.type))
        except Shredded:
            self._end(env.user_id, generation)
            self.shredded += 1
            return dataclasses.replace(r, value=None, sealing=SHREDDED)
        except NotSealed as exc:
            return dataclasses.replace(r, sealing=f"a sealed record that does not open: {exc}")
        return dataclasses.replace(r, value=value, sealed_value=r.value, generation=generation)

    async def _note_forget(self, type_name: str, r: Record) -> None:
        """A user's forget read on the log ends their key's generation for what follows it. Only
        one the steps will apply: under its user's own key and partition (screening
        dead-letters the rest, which must end nobody's key), and only the generation the key
        store stamps it with, whatever a client wrote in it. A reader that does not know the
        partition count (``partitions`` unset) goes by the stamp the workers made, if any."""
        try:
            record = decode_event(r.value) if type_name == _FORGETS[0] else decode_decision(r.value)
        except InvalidEvent:
            return
        if getattr(record, "kind", "user") != "user" or r.key != record.user_id.encode():
            return
        generation = record.generation
        if isinstance(record, UserForgotten):
            if self.partitions is None:
                # Read by an offline tool (a replay, a reform), which cannot tell whether the
                # workers applied it: only a forget they stamped ends a key, and nothing is stamped here.
                generation = None if self.keys is None else await self.keys.stamped(record.user_id,
                                                                                     record.event_id.bytes)
            elif expected_partition(r.key, self.partitions) != r.partition:
                return
            else:
                generation = await self.stamp(record, r.timestamp_ms / 1000)
        if generation:
            self._end(record.user_id, generation)
            if self.keys is not None:
                self.keys.drop(record.user_id, generation)

    async def destroy(self, user_id: str, generation: int | None) -> None:
        """Destroy ``user_id``'s key ``generation`` and older ones (None: all): once a forget of
        them has been applied and every decision about what they said before it sealed."""
        if self.keys is not None and generation != 0:
            await self.keys.destroy(user_id, generation)
            log.info("destroyed a data key (generation %s)", generation)
