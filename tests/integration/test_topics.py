"""A run with topics of its own deletes them, and only them, when it ends (``drop_topics``)."""
from __future__ import annotations

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from memstream.streams.log.topics import drop_topics, ensure_topics

from .conftest import wait_until

pytestmark = pytest.mark.asyncio


async def topics(settings) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def test_a_run_drops_its_topics_and_what_was_made_from_them_but_no_others(settings, runs):
    neighbour = settings.model_copy(update={
        "events_topic": settings.events_topic + "x", "decisions_topic": settings.decisions_topic + "x",
        "ingress_topic": settings.ingress_topic + "x", "dead_letter_topic": settings.dead_letter_topic + "x",
        "group_id": settings.group_id + "x"})
    runs.append(neighbour)
    await ensure_topics(neighbour)
    grown = [f"{settings.events_topic}.p8", f"{settings.group_id}.p8-__assignor-__leader"]
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, 1, 1) for t in grown])
    finally:
        await admin.close()
    await wait_until(lambda: _listed(settings, grown), timeout=20, what="the made topics listed")
    dropped = await drop_topics(settings)
    assert set(dropped) == {settings.events_topic, settings.decisions_topic, settings.ingress_topic,
                            settings.dead_letter_topic, *grown}
    left = await topics(settings)
    assert left.isdisjoint(dropped) and {neighbour.events_topic, neighbour.decisions_topic} <= left


async def _listed(settings, names) -> bool:
    return set(names) <= await topics(settings)


async def test_a_start_keeps_what_an_operator_set_on_the_ingress_and_dead_letter_topics(settings):
    """AlterConfigs replaces a topic's every setting: the window is applied with the others."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from memstream.streams.log.topics import dynamic_configs, plaintext_window

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        for topic in (settings.ingress_topic, settings.dead_letter_topic):
            await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs={
                **await dynamic_configs(admin, topic), "compression.type": "zstd"})])
        await ensure_topics(settings.model_copy(update={"plaintext_retention_s": 7200}))  # a changed window
        for topic in (settings.ingress_topic, settings.dead_letter_topic):
            have = await dynamic_configs(admin, topic)
            assert have.get("compression.type") == "zstd", topic
            window = plaintext_window(settings.model_copy(update={"plaintext_retention_s": 7200}))
            assert {k: have.get(k) for k in window} == window
    finally:
        await admin.close()
