"""``memstream status``: where every step of the pipeline stands, for people and for monitors.

Per step (the projections, formation, the ingress sealing) and partition: the stored position,
the topic's high-water mark, the lag in records and in seconds (the age of the oldest record
not yet applied), then the dead letters and the last one's reason, and the workers' consumer
groups with their members and assignments, and the last decay and reflection sweeps of each
partition.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from memstream.config import Settings
from memstream.projections import db
from memstream.streams.log.log_topics import moves
from memstream.streams.log.kafka_util import groupless_consumer, partitions_of
from memstream.streams.log.topics import step_routes

log = logging.getLogger("memstream.status")


@dataclass
class Position:
    projection: str
    topic: str
    partition: int
    applied: int
    end: int
    lag: int
    lag_s: float | None  # None: nothing to apply


@dataclass
class Member:
    client_id: str
    host: str
    assigned: list[str]


@dataclass
class Status:
    positions: list[Position]
    dead_letters: int
    last_dead_letter: dict | None
    groups: dict[str, list[Member]] = field(default_factory=dict)
    moves: list[dict] = field(default_factory=list)  # the log's moves to more partitions (streams.log.log_topics)
    sweeps: list[dict] = field(default_factory=list)  # the last decay sweep per events partition (streams.ops.sweep)
    reflections: list[dict] = field(default_factory=list)  # the last reflection sweep per events partition
    unavailable: dict[str, str] = field(default_factory=dict)  # a part of the report that failed, and why

    @property
    def max_lag(self) -> int:
        return max((p.lag for p in self.positions), default=0)

    def as_dict(self) -> dict:
        return {**asdict(self), "max_lag": self.max_lag}

    def lines(self) -> list[str]:
        out = [f"{'projection':<11} {'topic':<24} {'part':>4} {'applied':>9} {'end':>9} {'lag':>7} {'lag s':>7}"]
        for p in self.positions:
            age = "" if p.lag_s is None else f"{p.lag_s:.1f}"
            out.append(f"{p.projection:<11} {p.topic:<24} {p.partition:>4} {p.applied:>9} {p.end:>9} {p.lag:>7} {age:>7}")
        out.append(f"dead letters: {self.dead_letters}" + (
            f" (last: {self.last_dead_letter['stage']} at {self.last_dead_letter['source']}: "
            f"{self.last_dead_letter['reason']})" if self.last_dead_letter else ""))
        for group, members in self.groups.items():
            out.append(f"group {group}: {len(members)} member(s)")
            out += [f"  {m.client_id} {m.host}: {' '.join(m.assigned) or '(none)'}" for m in members]
        out += [f"log moved from {m['from_events']} ({m['from_partitions']} partitions) to {m['to_events']} "
                f"({m['partitions']}): {m['state']}" for m in self.moves]
        out += [f"decay sweep {w['sweep_id']} on {w['topic']}/{w['partition']} at {w['swept_at']}: "
                f"{w['archived']} facts archived, {w['cooled']} episodes to the cold index, of {w['users']} users"
                for w in self.sweeps]
        out += [f"reflection sweep {w['sweep_id']} on {w['topic']}/{w['partition']} at {w['swept_at']}: "
                f"{w['clusters']} clusters of {w['users']} users asked about" for w in self.reflections]
        out += [f"{part}: unavailable ({why})" for part, why in self.unavailable.items()]
        return out


async def pipeline_status(settings: Settings, dsn: str) -> Status:
    pool = await db.create_pool(dsn, settings.postgres_schema, max_size=1)
    try:
        # The topics the log lives in now: positions on topics it moved out of are history.
        rows = await pool.fetch("SELECT projection, topic, partition, next_offset FROM projection_positions "
                                "WHERE topic = ANY($1::text[]) ORDER BY 1, 2, 3",
                                [settings.events_topic, settings.decisions_topic, settings.ingress_topic])
        moved = [{k: m[k] for k in ("from_events", "to_events", "from_partitions", "partitions", "state")}
                 for m in await moves(pool, settings)]
        sweeps = [{**dict(r), "sweep_id": str(r["sweep_id"]), "swept_at": r["swept_at"].isoformat()}
                  for r in await pool.fetch("SELECT topic, partition, sweep_id, swept_at, users, archived, cooled "
                                            "FROM decay_sweeps ORDER BY topic, partition")]
        reflected = [{**dict(r), "sweep_id": str(r["sweep_id"]), "swept_at": r["swept_at"].isoformat()}
                     for r in await pool.fetch("SELECT topic, partition, sweep_id, swept_at, users, clusters "
                                               "FROM reflection_sweeps ORDER BY topic, partition")]
    finally:
        await pool.close()
    unavailable: dict[str, str] = {}

    async def part(name: str, default, probe):
        """A part of the report that may fail on its own: the rest (the lag) is still reported."""
        try:
            return await probe
        except Exception as exc:  # noqa: BLE001 - reported, with the reason, in the status itself
            log.warning("status: %s unavailable", name, exc_info=True)
            unavailable[name] = f"{type(exc).__name__}: {exc}"[:300]
            return default

    async with groupless_consumer(settings.kafka_bootstrap) as consumer:
        positions = await _positions(consumer, rows, step_routes(settings))
        dead, last = await part("dead letters", (0, None), _dead_letters(consumer, settings.dead_letter_topic))
    groups = await part("groups", {}, worker_groups(settings))
    return Status(positions, dead, last, groups, moved, sweeps, reflected, unavailable)


async def _positions(consumer, rows, routes) -> list[Position]:
    """Every step on every partition of its topic: one that never stored a position (never ran,
    or never finished a batch there) stands at 0, behind everything on the partition."""
    stored = {(r["projection"], r["topic"], r["partition"]): r["next_offset"] for r in rows}
    steps = sorted({(step, topic) for by_topic in routes.values() for topic, names in by_topic.items()
                    for step in names} | {(s, t) for s, t, _ in stored})
    parts = {t: await partitions_of(consumer, t) for t in sorted({t for _, t in steps})}
    tps = [TopicPartition(t, p) for t, ps in parts.items() for p in ps]
    ends = await consumer.end_offsets(tps) if tps else {}
    out = []
    for step, topic in steps:
        for p in sorted(set(parts[topic]) | {q for s, t, q in stored if (s, t) == (step, topic)}):
            tp, applied = TopicPartition(topic, p), stored.get((step, topic, p), 0)
            end = ends.get(tp, 0)
            lag = max(end - applied, 0)
            out.append(Position(step, topic, p, applied, end, lag, await _age(consumer, tp, applied) if lag else None))
    return out


async def _age(consumer, tp: TopicPartition, offset: int) -> float | None:
    """Seconds since the record at ``offset`` was appended (None if it is gone: retention)."""
    [m] = await _fetch(consumer, tp, offset) or [None]
    return None if m is None else round(max(0.0, time.time() - m.timestamp / 1000), 3)


async def _fetch(consumer, tp: TopicPartition, offset: int) -> list:
    consumer.assign([tp])
    consumer.seek(tp, offset)
    return (await consumer.getmany(tp, timeout_ms=2000, max_records=1)).get(tp, [])[:1]


async def _dead_letters(consumer, topic: str) -> tuple[int, dict | None]:
    tps = [TopicPartition(topic, p) for p in await partitions_of(consumer, topic)]
    if not tps:
        return 0, None
    ends, starts = await consumer.end_offsets(tps), await consumer.beginning_offsets(tps)
    last = None
    for tp in tps:  # the newest letter across partitions
        if ends[tp] > starts[tp]:
            for m in await _fetch(consumer, tp, ends[tp] - 1):
                if last is None or m.timestamp > last.timestamp:
                    last = m
    held = sum(ends[tp] - starts[tp] for tp in tps)  # not the marks: retention deletes plain-text letters
    if last is None:
        return held, None
    h = {k: v.decode(errors="replace") for k, v in last.headers or ()}
    # The reason names what was wrong, never the record's content (a dead letter may be plain text).
    return held, {"reason": h.get("memstream.reason", "")[:500], "stage": h.get("memstream.stage", ""),
                                "source": h.get("memstream.source", ""), "at_ms": last.timestamp}


async def worker_groups(settings: Settings) -> dict[str, list[Member]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=10000)
    await admin.start()
    try:
        names = [settings.group_id, f"{settings.group_id}-projections"]
        # Only groups the broker knows: aiokafka cannot decode Kafka 4's answer for a missing one.
        known = {g[0] for g in await admin.list_consumer_groups()}
        out: dict[str, list[Member]] = {}
        for name in (n for n in names if n in known):
            for response in await admin.describe_consumer_groups([name]):
                for group in response.groups:
                    out[group[1]] = [_member(m) for m in (group[-2] if isinstance(group[-1], int) else group[-1])]
        return {name: out.get(name, []) for name in names}
    finally:
        await admin.close()


def _member(m) -> Member:
    client_id, host, assignment = m[-4], m[-3], m[-1]
    assigned = []
    if assignment:
        decoded = ConsumerProtocolMemberAssignment.decode(assignment)
        assigned = sorted(f"{topic}/{p}" for topic, parts in decoded.assignment for p in parts)
    return Member(client_id, host, assigned)
