"""``memstream partitions grow --to N``: more partitions for the log without breaking per-user order.

Kafka's own partition add remaps ``murmur2(user) % n``: a user's next records would land on
another partition than their history. Instead the log moves to new topics of N partitions (a
multiple of today's count, so each new partition is fed by exactly one old one, in order):

1. **copy** (online): records are copied partition by partition onto ``<topic>.p<N>``, each to
   the partition its key hashes to there, keys, values (still sealed), headers and timestamps
   kept, plus a ``memstream.moved-from`` header. Rounds repeat while producers and workers go
   on, until the tail left is small.
2. **fence**: the old events topic refuses every write (``max.message.bytes`` 0). ``TurnLog``
   appends and the ingress step wait; formation finishes the old events. Then the decisions
   topic is fenced and the projections finish the old decisions.
3. **cut over**, in one Postgres transaction: the tail copied, every step's position set at the
   end of what was copied (everything before it was applied), identity statements' offsets
   mapped onto the new partitions, the move recorded as done. Waiting appends go on to the new
   topics; workers restart themselves on them (``streams.worker.runtime``).

Each step is recorded in ``log_moves`` (``streams.log.log_topics``): run the command again after an
interruption and it resumes — the copy from its checkpoint, after reading what it wrote past it.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field

import msgspec
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError

from memstream.config import Settings
from memstream.projections import db
from memstream.schemas.codec import MALFORMED
from memstream.schemas.errors import InvalidArgument, MemstreamError
from memstream.schemas.events import SYSTEM_USER
from memstream.streams.log.screening import expected_partition
from memstream.streams.log.kafka_util import drain, groupless_consumer, partitions_of
from memstream.streams.log.log_topics import create_tables, live_log, move_from, moved, progress
from memstream.streams.log.producer import idempotent_producer
from memstream.streams.worker.switch_lock import switching
from memstream.streams.log.topics import FOREVER, _wait_for_leaders, dynamic_configs, steps_on

log = logging.getLogger("memstream.partitions")

MOVED_FROM = "memstream.moved-from"
FENCE = {"max.message.bytes": "0"}
# Host records the commands projection keeps the offset of (the latest statement wins; a use is
# counted once): where each landed on the new topics is recorded, and their rows mapped to it.
OFFSET_KEPT = frozenset({"PersonIdentitySet", "ExpertIdentityUpserted", "ExpertIdentityDeleted", "MemoriesUsed"})
SMALL_TAIL = 1000  # records left after a copy round: fence now, the pause is short
MAX_ROUNDS = 5
LAG_BEFORE_FENCE = 100  # records the workers have left on the old topics when they are fenced (at best)


class GrowthError(MemstreamError):
    """The move cannot go on now (a step lags, a count does not match); run it again to resume."""


@dataclass
class GrowthReport:
    from_events: str
    to_events: str
    from_partitions: int
    partitions: int
    copied: dict[str, int] = field(default_factory=dict)
    fenced_s: float = 0.0  # how long appends waited
    phases: dict[str, float] = field(default_factory=dict)  # of that wait
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        copied = ", ".join(f"{n:,} from {t}" for t, n in self.copied.items())
        return (f"the log moved from {self.from_events} ({self.from_partitions} partitions) to {self.to_events} "
                f"({self.partitions} partitions): {copied}; appends waited {self.fenced_s:.1f} s ("
                + ", ".join(f"{k} {v:.1f} s" for k, v in self.phases.items()) + "); "
                f"{self.seconds:.1f} s in all")


class _Typed(msgspec.Struct):
    type: str = ""


def _type(value: bytes | None) -> str:
    try:
        return msgspec.json.decode(value or b"", type=_Typed).type
    except MALFORMED:
        return ""


class _Copy:
    """Copies one topic onto its successor, resumably. ``sources[p]``: every record of old
    partition p before it is on the new topic; ``last[t]``: the old offset of the newest record
    on new partition t (a resumed round skips what a crashed one wrote past the checkpoint)."""

    def __init__(self, move_key: str, src: str, dst: str, n: int, to: int, keys_schema: str):
        self.move_key, self.src, self.dst, self.n, self.to, self.keys = move_key, src, dst, n, to, keys_schema
        self.sources: dict[int, int] = {}
        self.targets: dict[int, int] = {}  # new partition -> next offset covered by the checkpoint
        self.last: dict[int, int] = {}
        self.copied = 0

    def target(self, partition: int, key: bytes | None) -> int:
        # A record not on its key's partition (dead-lettered when it came) stays off it.
        if key is None or expected_partition(key, self.n) != partition:
            return partition
        return expected_partition(key, self.to)

    def identity(self, r, old_partition: int) -> bool:
        """A record of ``OFFSET_KEPT`` the commands projection applied (one on its key's partition)."""
        return (r.key is not None and expected_partition(r.key, self.n) == old_partition
                and _type(r.value) in OFFSET_KEPT)

    def load(self, state: dict) -> None:
        mine = state.get(self.src, {})
        self.sources = {int(p): o for p, o in mine.get("sources", {}).items()}
        self.targets = {int(t): o for t, o in mine.get("targets", {}).items()}
        self.last = {int(t): o for t, o in mine.get("last", {}).items()}

    def state(self) -> dict:
        return {"sources": self.sources, "targets": self.targets, "last": self.last}

    async def recover(self, consumer, offsets, pool) -> None:
        """Read what was written past the checkpoint (a run interrupted mid-batch)."""
        tps = [TopicPartition(self.dst, t) for t in range(self.to)]
        ends = await offsets.end_offsets(tps)
        behind = [tp for tp in tps if ends[tp] > self.targets.get(tp.partition, 0)]
        if not behind:
            return
        consumer.assign(behind)
        for tp in behind:
            consumer.seek(tp, self.targets.get(tp.partition, 0))
        mapped = []

        async def note(batch) -> None:
            for r in batch:
                p, o = _moved_from(r.headers)
                self.last[r.partition] = o
                if self.identity(r, p):
                    mapped.append((self.src, _user_key(r.key), o, r.partition, r.offset))
            self.targets[batch[-1].partition] = batch[-1].offset + 1

        await drain(consumer, behind, ends, note)
        await self._checkpoint(pool, mapped)
        log.info("%s: recovered %d partitions past the checkpoint", self.dst, len(behind))

    async def round(self, consumer, offsets, producer, pool, on_progress=None) -> int:
        """Copy up to the current ends; returns how many records arrived meanwhile."""
        tps = [TopicPartition(self.src, p) for p in range(self.n)]
        ends = await offsets.end_offsets(tps)
        begins = await offsets.beginning_offsets(tps)
        todo = [tp for tp in tps if ends[tp] > max(self.sources.get(tp.partition, 0), begins[tp])]
        if todo:
            consumer.assign(todo)
            for tp in todo:
                consumer.seek(tp, max(self.sources.get(tp.partition, 0), begins[tp]))
            total = sum(ends[tp] - max(self.sources.get(tp.partition, 0), begins[tp]) for tp in todo)
            done = [0]

            async def copy(batch) -> None:
                sends, identities = [], []
                for r in batch:
                    t = self.target(r.partition, r.key)
                    if r.offset <= self.last.get(t, -1):
                        continue  # written by an interrupted run, past its checkpoint
                    headers = [*r.headers, (MOVED_FROM, f"{r.partition}/{r.offset}".encode())]
                    sends.append((r, t, await producer.send(self.dst, r.value, key=r.key, partition=t,
                                                            headers=headers, timestamp_ms=r.timestamp_ms)))
                for r, t, fut in sends:
                    meta = await fut
                    self.last[t] = r.offset
                    self.targets[t] = meta.offset + 1
                    if self.identity(r, r.partition):
                        identities.append((self.src, _user_key(r.key), r.offset, t, meta.offset))
                self.sources[batch[0].partition] = batch[-1].offset + 1
                self.copied += len(sends)
                await self._checkpoint(pool, identities)
                done[0] += len(batch)
                if on_progress:
                    on_progress(done[0], total)

            await drain(consumer, todo, ends, copy)
        now = await offsets.end_offsets(tps)
        return sum(now[tp] - self.sources.get(tp.partition, 0) for tp in tps)

    async def _checkpoint(self, pool, identities) -> None:
        async with pool.acquire() as conn, conn.transaction():
            if identities:
                await conn.executemany(
                    f'INSERT INTO "{self.keys}".log_moved_offsets (from_topic, user_key, old_offset, new_partition, '
                    "new_offset) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING", identities)
            await conn.execute(
                f'UPDATE "{self.keys}".log_moves SET progress = jsonb_set(progress, $2::text[], $3::jsonb) '
                "WHERE from_events = $1", self.move_key, [self.src], json.dumps(self.state()))

    async def check(self, offsets) -> int:
        """Every old record is on the new topic, once: returns how many."""
        old = [TopicPartition(self.src, p) for p in range(self.n)]
        new = [TopicPartition(self.dst, t) for t in range(self.to)]
        ends, begins, copied = (await offsets.end_offsets(old), await offsets.beginning_offsets(old),
                                await offsets.end_offsets(new))
        want = sum(ends[tp] - begins[tp] for tp in old)
        if any(self.sources.get(tp.partition, 0) < ends[tp] for tp in old) or sum(copied.values()) != want:
            raise GrowthError(f"{self.dst} holds {sum(copied.values())} records, {self.src} {want}: not a copy; "
                              "run the command again")
        return want


def _moved_from(headers) -> tuple[int, int]:
    value = dict(headers)[MOVED_FROM].decode()
    p, o = value.split("/")
    return int(p), int(o)


def _user_key(key: bytes | None) -> bytes:
    return hashlib.sha256(key or b"").digest()


async def grow_partitions(settings: Settings, dsn: str, to: int, *, on_progress=None,
                          drain_timeout_s: float = 300.0) -> GrowthReport:
    """Move the log to ``to`` partitions (see the module docstring); resumes a move under way."""
    t0 = time.monotonic()
    pool = await db.create_pool(dsn, settings.postgres_schema, min_size=0, max_size=3)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=15000)
    await admin.start()
    lock = await pool.acquire()
    try:
        await create_tables(pool, settings)
        # One run at a time: two would copy every record twice.
        if not await lock.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", f"memstream-grow:{settings.keys_schema}"):
            raise GrowthError("another `memstream partitions grow` is running for this deployment")
        if await switching(pool, settings.postgres_schema):  # it would switch in a schema of the old topics
            raise GrowthError("a `memstream switch` is under way: let it finish, then run this again")
        live = await live_log(settings, pool)
        # Two consumers: offset lookups would wait behind the reader's long-polling fetches.
        async with groupless_consumer(settings.kafka_bootstrap) as consumer, \
                groupless_consumer(settings.kafka_bootstrap) as offsets:
            n = len(await partitions_of(offsets, live.events_topic))
            if len(await partitions_of(offsets, live.decisions_topic)) != n or not n:
                raise GrowthError(f"{live.events_topic} and {live.decisions_topic} must exist with one partition count")
            move = await move_from(live, pool)
            if move is None:
                if to <= n or to % n:
                    raise InvalidArgument(f"--to must be a multiple of today's {n} partitions above it (e.g. {2 * n}): "
                                          "each new partition then takes one old partition's users, in order")
                await pool.execute(
                    f'INSERT INTO "{settings.keys_schema}".log_moves (from_events, from_decisions, to_events, '
                    "to_decisions, from_partitions, partitions, state) VALUES ($1, $2, $3, $4, $5, $6, 'copying')",
                    live.events_topic, live.decisions_topic, f"{settings.events_topic}.p{to}",
                    f"{settings.decisions_topic}.p{to}", n, to)
                move = await move_from(live, pool)
            elif move["partitions"] != to:
                raise InvalidArgument(f"a move to {move['partitions']} partitions is under way: run "
                                      f"`memstream partitions grow --to {move['partitions']}` to finish it")
            report = GrowthReport(live.events_topic, move["to_events"], n, to)
            await _create(admin, settings, [move["to_events"], move["to_decisions"]], to)
            copies = [_Copy(live.events_topic, live.events_topic, move["to_events"], n, to, settings.keys_schema),
                      _Copy(live.events_topic, live.decisions_topic, move["to_decisions"], n, to, settings.keys_schema)]
            state = progress(move)
            producer = idempotent_producer(settings.kafka_bootstrap)
            await producer.start()
            try:
                for c in copies:
                    c.load(state)
                    await c.recover(consumer, offsets, pool)
                if move["state"] == "copying":
                    for _ in range(MAX_ROUNDS):
                        left = [await c.round(consumer, offsets, producer, pool, on_progress) for c in copies]
                        if sum(left) <= SMALL_TAIL:
                            break
                    # Fence once the workers are nearly done with the old topics: appends wait
                    # while they finish, so the less left, the shorter the wait.
                    await _drained(offsets, pool, live.events_topic, n, steps_on(live, live.events_topic), drain_timeout_s,
                                   slack=LAG_BEFORE_FENCE)
                    await _drained(offsets, pool, live.decisions_topic, n, steps_on(live, live.decisions_topic),
                                   drain_timeout_s, slack=LAG_BEFORE_FENCE)
                    for c in copies:
                        await c.round(consumer, offsets, producer, pool, on_progress)
                    await pool.execute(f'UPDATE "{settings.keys_schema}".log_moves SET state = \'fenced\', '
                                       "fenced_at = now() WHERE from_events = $1", live.events_topic)
                fenced = time.monotonic()
                await _fence(admin, live.events_topic)
                report.phases["fence events"] = time.monotonic() - fenced
                await _drained(offsets, pool, live.events_topic, n, ["formation"], drain_timeout_s)
                report.phases["formation finishes"] = time.monotonic() - fenced - sum(report.phases.values())
                await _fence(admin, live.decisions_topic)
                report.phases["fence decisions"] = time.monotonic() - fenced - sum(report.phases.values())
                await _drained(offsets, pool, live.decisions_topic, n, steps_on(live, live.decisions_topic), drain_timeout_s)
                await _drained(offsets, pool, live.events_topic, n, ["commands"], drain_timeout_s)
                report.phases["projections finish"] = time.monotonic() - fenced - sum(report.phases.values())
                for c in copies:
                    await c.round(consumer, offsets, producer, pool, on_progress)
                    report.copied[c.src] = await c.check(offsets)
                report.phases["copy the tail"] = time.monotonic() - fenced - sum(report.phases.values())
            finally:
                await producer.stop()
            new_ends = {c.src: await offsets.end_offsets([TopicPartition(c.dst, t) for t in range(to)])
                        for c in copies}
            old_ends = {c.src: await offsets.end_offsets([TopicPartition(c.src, p) for p in range(n)]) for c in copies}
            if any(c.sources.get(tp.partition, 0) != end for c in copies for tp, end in old_ends[c.src].items()):
                raise GrowthError("records reached the old topics after the fence (a broker applied it late): "
                                  "run the command again")
            await _commit_group_offsets(pool, live, moved(live, move), new_ends)
            await _cut_over(pool, settings, live, move, to, new_ends, old_ends)
            report.fenced_s = time.monotonic() - fenced
        report.seconds = time.monotonic() - t0
        log.info("%s", report.render())
        return report
    finally:
        await lock.execute("SELECT pg_advisory_unlock_all()")
        await pool.release(lock)
        await admin.close()
        await pool.close()


async def _create(admin, settings: Settings, names: list[str], partitions: int) -> None:
    existing = set(await admin.list_topics())
    wanted = [NewTopic(name, partitions, settings.replication_factor, topic_configs=FOREVER)
              for name in names if name not in existing]
    if wanted:
        try:
            await admin.create_topics(wanted)
        except TopicAlreadyExistsError:
            pass
        await _wait_for_leaders(admin, [t.name for t in wanted])


async def _fence(admin, topic: str) -> None:
    """No producer can append to ``topic`` from now on (the broker refuses any record)."""
    # AlterConfigs replaces a topic's whole dynamic config: send what is set (retention forever)
    # with the fence, or the old topics would fall back to the broker's 7-day retention.
    configs = {**await dynamic_configs(admin, topic), **FENCE}
    answers = await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)])
    errors = [(code, msg) for a in answers for code, msg, *_ in a.resources if code]
    if errors:
        raise GrowthError(f"the broker refused the fence on {topic}: {errors}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (await dynamic_configs(admin, topic)).get("max.message.bytes") == FENCE["max.message.bytes"]:
            await asyncio.sleep(0.5)  # the partition leaders apply the config from the metadata log
            return
        await asyncio.sleep(0.1)
    raise GrowthError(f"the broker did not take the fence on {topic} within 30 s")


async def _drained(consumer, pool, topic: str, n: int, steps: list[str], timeout_s: float, slack: int = 0) -> None:
    """Wait until ``steps`` have applied every record of the fenced ``topic`` (``n``
    partitions); with ``slack``, until at most that many are left of a topic still written to
    (at most ``timeout_s``)."""
    tps = [TopicPartition(topic, p) for p in range(n)]
    deadline = time.monotonic() + timeout_s
    while True:
        ends = await consumer.end_offsets(tps)
        rows = await pool.fetch("SELECT projection, partition, next_offset FROM projection_positions "
                                "WHERE topic = $1 AND projection = ANY($2::text[])", topic, steps)
        at = {(r["projection"], r["partition"]): r["next_offset"] for r in rows}
        lag = {s: sum(max(0, e - at.get((s, tp.partition), 0)) for tp, e in ends.items()) for s in steps}
        if all(n <= slack for n in lag.values()):
            return
        behind = ", ".join(f"{s} is {n} records behind" for s, n in lag.items() if n)
        if time.monotonic() > deadline:
            if slack:
                log.warning("fencing %s although %s: appends wait until the workers finish it", topic, behind)
                return
            raise GrowthError(f"{behind} on {topic}: start the workers (they finish the old topics, then move on) "
                              "and run this again")
        await asyncio.sleep(0.2)


async def _commit_group_offsets(pool, live: Settings, after: Settings, new_ends) -> None:
    """The workers' groups for the new topics (unused until the cut-over) start where the
    positions will: at the end of what was copied, and the ingress where its sealing stands."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import OffsetAndMetadata

    sealing = {r["partition"]: r["next_offset"] for r in await pool.fetch(
        "SELECT partition, next_offset FROM projection_positions WHERE projection = 'sealing' AND topic = $1",
        live.ingress_topic)}
    events = {TopicPartition(after.events_topic, tp.partition): o for tp, o in new_ends[live.events_topic].items()}
    decisions = {TopicPartition(after.decisions_topic, tp.partition): o
                 for tp, o in new_ends[live.decisions_topic].items()}
    ingress = {TopicPartition(live.ingress_topic, p): o for p, o in sealing.items()}
    for group, offsets in ((after.group_id, events), (f"{after.group_id}-projections", {**decisions, **events, **ingress})):
        consumer = AIOKafkaConsumer(bootstrap_servers=live.kafka_bootstrap, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign(list(offsets))
            await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in offsets.items() if o})
        finally:
            await consumer.stop()


async def _cut_over(pool, settings: Settings, live: Settings, move, to: int, new_ends, old_ends) -> None:
    """Positions onto the new topics (everything copied was applied), identity offsets mapped,
    the move done: one transaction, taken only from the fenced state and only if every step
    still stands at the end of the old topics."""
    renamed = {live.events_topic: move["to_events"], live.decisions_topic: move["to_decisions"]}
    keys = settings.keys_schema
    async with pool.acquire() as conn, conn.transaction():
        done = await conn.execute(f'UPDATE "{keys}".log_moves SET state = \'moved\', moved_at = now() '
                                  "WHERE from_events = $1 AND state = 'fenced'", live.events_topic)
        if done != "UPDATE 1":
            raise GrowthError(f"the move out of {live.events_topic} is not fenced any more (another run cut over?)")
        for topic, steps in ((t, steps_on(live, t)) for t in (live.events_topic, live.decisions_topic)):
            at = {(r["projection"], r["partition"]): r["next_offset"] for r in await conn.fetch(
                "SELECT projection, partition, next_offset FROM projection_positions WHERE topic = $1", topic)}
            if behind := [f"{step} {topic}/{tp.partition}" for step in steps for tp, end in old_ends[topic].items()
                          if end and at.get((step, tp.partition), 0) < end]:
                raise GrowthError(f"not applied to the end of the old topics: {', '.join(behind)}; run the command again")
        rows = await conn.fetch("SELECT DISTINCT projection, topic FROM projection_positions WHERE topic = ANY($1::text[])",
                                list(renamed))
        ends = {renamed[src]: {tp.partition: o for tp, o in e.items()} for src, e in new_ends.items()}
        await conn.executemany(
            """INSERT INTO projection_positions (projection, topic, partition, next_offset) VALUES ($1, $2, $3, $4)
               ON CONFLICT (projection, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset""",
            [(r["projection"], renamed[r["topic"]], t, ends[renamed[r["topic"]]][t])
             for r in rows for t in range(to)])
        mapped = (f'FROM "{keys}".log_moved_offsets m WHERE m.from_topic = $1 AND m.old_offset = t.source_offset '
                  "AND m.user_key = sha256(convert_to({}, 'UTF8'))")
        await conn.execute("UPDATE person_identities t SET source_offset = m.new_offset " + mapped.format("t.user_id"),
                           live.events_topic)
        await conn.execute("UPDATE expert_identities t SET source_offset = m.new_offset " + mapped.format("$2::text"),
                           live.events_topic, SYSTEM_USER)  # the host-wide key's
        for uses in ("fact_uses", "episode_uses"):  # else a use on the new topics (lower offsets) is not counted
            await conn.execute(f"UPDATE {uses} t SET source_offset = m.new_offset " + mapped.format("t.user_id"),
                               live.events_topic)
        # Needed for the mapping only: its digests of user ids go with it.
        await conn.execute(f'DELETE FROM "{keys}".log_moved_offsets WHERE from_topic = $1', live.events_topic)
