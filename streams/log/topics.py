"""Topic names and creation. Events and decisions share one partition count so that a user's
events and decisions land in the same partition number (both are keyed by ``user_id``)."""
from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError

from memstream.config import Settings
from memstream.streams.log.errors import BrokerUnavailable

log = logging.getLogger("memstream.streams")

# The log is the source of truth: nothing ages out of it.
FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}


def plaintext_window(settings: Settings) -> dict[str, str]:
    """The configs of a topic whose records may be plain text (ingress, dead letters): deleted
    after ``plaintext_retention_s``. Kafka deletes a segment once its newest record is that old,
    so segments roll every tenth of the window and a deleted one is unlinked within a minute:
    no record outlives 1.1 windows plus the broker's retention check interval and that minute."""
    window = max(1000, int(settings.plaintext_retention_s * 1000))
    return {"retention.ms": str(window), "retention.bytes": "-1", "segment.ms": str(max(1000, window // 10)),
            "file.delete.delay.ms": str(min(60_000, window)),
            # Retention counts from the broker's clock: a client's timestamp cannot stretch the window.
            "message.timestamp.type": "LogAppendTime"}


def step_routes(settings: Settings) -> dict[str, dict[str, tuple[str, ...]]]:
    """role -> topic -> the steps that role runs on it (and stores positions for)."""
    return {"formation": {settings.events_topic: ("formation",)},
            "projections": {settings.decisions_topic: ("episodes", "facts", "graph"),
                            settings.events_topic: ("commands",), settings.ingress_topic: ("sealing",)}}


def steps_on(settings: Settings, topic: str) -> list[str]:
    """Every step, of either role, that reads ``topic``."""
    return [step for by_topic in step_routes(settings).values() for step in by_topic.get(topic, ())]


async def ensure_topics(settings: Settings) -> None:
    """Create the events, decisions, ingress and dead-letter topics if missing, and give the
    ingress and dead-letter topics the plaintext window of ``settings``. Partition counts of
    existing topics are never changed here: that would move users' keys."""
    async with _admin(settings) as admin:
        existing = set(await admin.list_topics())
        window = plaintext_window(settings)
        configs = {settings.events_topic: FOREVER, settings.decisions_topic: FOREVER,
                   settings.ingress_topic: window, settings.dead_letter_topic: window}
        wanted = [NewTopic(name, settings.partitions, settings.replication_factor, topic_configs=c)
                  for name, c in configs.items() if name not in existing]
        # A changed window applies to topics made before. AlterConfigs replaces every setting of
        # the topic: the others an operator set are given back with it, and nothing is sent
        # when the window is already there.
        bounded = []
        for name in (settings.ingress_topic, settings.dead_letter_topic):
            if name in existing:
                have = await dynamic_configs(admin, name)
                if any(have.get(k) != v for k, v in window.items()):
                    bounded.append(ConfigResource(ConfigResourceType.TOPIC, name, configs={**have, **window}))
        if bounded:
            await admin.alter_configs(bounded)
        if wanted:
            try:
                await admin.create_topics(wanted)
            except TopicAlreadyExistsError:
                pass
            log.info("created topics %s", [t.name for t in wanted])
        # New partitions, and existing ones on a broker just restarted (it elects their leaders
        # as it loads its logs: many topics take a while), answer LeaderNotAvailable until then.
        await _wait_for_leaders(admin, list(configs), timeout=120)
        await _check_copartitioned(admin, settings)


async def drop_topics(*runs: Settings) -> list[str]:
    """Delete the topics of runs with topics of their own (tests, benchmarks): each run's four,
    those made from them (a grown or moved log's ``<name>.p<N>``, a reform's
    ``<decisions>.<version>``) and Faust's for its consumer groups (``<group_id>-...``; a grown
    log's ``<group_id>.p<N>-...``). A broker loads every topic it holds at each start: thousands
    left behind made the local one take minutes. Returns those deleted."""
    if not runs:
        return []
    names = {n for s in runs for n in (s.events_topic, s.decisions_topic, s.ingress_topic, s.dead_letter_topic)}
    made = (*(n + "." for n in names), *(s.group_id + end for s in runs for end in "-."))
    async with _admin(runs[0]) as admin:
        mine = sorted(t for t in await admin.list_topics() if t in names or t.startswith(made))
        for i in range(0, len(mine), 500):  # a request the controller answers within the timeout
            await admin.delete_topics(mine[i:i + 500])
        return mine


@contextlib.asynccontextmanager
async def _admin(settings: Settings):
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=15000)
    try:
        await admin.start()
    except KafkaConnectionError as exc:
        raise BrokerUnavailable(f"cannot reach Kafka at {settings.kafka_bootstrap}: {exc}") from exc
    try:
        yield admin
    finally:
        await admin.close()


async def _wait_for_leaders(admin: AIOKafkaAdminClient, topics: list[str], timeout: float = 30) -> None:
    """New partitions answer NotLeaderForPartition until the controller elects a leader."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        described = await admin.describe_topics(topics)
        if all(d["partitions"] and all(p["leader"] >= 0 for p in d["partitions"]) for d in described):
            return
        await asyncio.sleep(0.1)
    log.warning("topics %s still have partitions without a leader after %.0fs", topics, timeout)


async def _check_copartitioned(admin: AIOKafkaAdminClient, settings: Settings) -> None:
    described = await admin.describe_topics([settings.events_topic, settings.decisions_topic])
    counts = {d["topic"]: len(d["partitions"]) for d in described}
    if len(set(counts.values())) != 1:
        raise RuntimeError(f"events and decisions topics must have one partition count, found {counts}")


async def dynamic_configs(admin, topic: str) -> dict[str, str]:
    """The configs set on ``topic`` itself (not the broker's defaults)."""
    described = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    out = {}
    for answer in described:
        for res in answer.resources:
            for name, value, _read_only, source, *_ in res[4]:
                # DescribeConfigs v0 says "is default" (a bool), v1+ the source (1: set on the topic).
                if (not source) if isinstance(source, bool) else source == 1:
                    out[name] = value
    return out
