"""What is given up at a revoke stays given up: a batch handed on while the revoke is under way
is not applied, a turn cancelled as its model call fails is not retried, and ``process`` does
not report work it abandoned as durable (fakes for Faust's events and the model, no stack)."""
import asyncio
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from memstream.config import Settings
from memstream.llm.offline import OfflineExtractor, OfflineResolver
from memstream.llm.offline_relations import OfflineTurnExtractor
from memstream.llm.protocols import Throttled
from memstream.schemas import TurnRecorded
from memstream.schemas.codec import encode
from memstream.streams.worker.formation.pipeline import Abandoned, Formation
from memstream.streams.log.records import Record
from memstream.streams.worker.runtime import Runtime
from tests.unit.test_turn_resolution import Scattered


class Applied:
    name = "applied"

    def __init__(self):
        self.offsets = []

    async def process(self, records):
        self.offsets += [r.offset for r in records]


class Open:
    async def filter(self, records):
        return records

    def forget(self, tps):
        pass


class Plain:
    shredded = plain_records = 0

    async def open(self, records):
        return records


def event(offset: int, generation: int):
    return SimpleNamespace(message=SimpleNamespace(topic="t", partition=0, offset=offset, key=b"k", value=b"v",
                                                   headers=(), timestamp=0.0, generation_id=generation))


async def test_no_event_is_applied_from_a_revoke_until_the_next_assignment():
    runtime = Runtime(Settings(), "postgresql://unused", "projections")
    runtime.app = SimpleNamespace(consumer_generation_id=1)
    step = Applied()
    runtime.steps, runtime.sealers = {"applied": (step, Open())}, {"t": Plain()}
    await runtime.run_batch(["applied"], [event(0, 1)])
    await runtime.revoke([])
    await runtime.run_batch(["applied"], [event(1, 1)])  # fetched before the revoke, handed on during it
    runtime.app.consumer_generation_id = 2  # assigned again
    await runtime.run_batch(["applied"], [event(1, 1), event(2, 2)])
    assert step.offsets == [0, 2]


async def test_an_assignment_under_the_revoked_generation_is_applied():
    runtime = Runtime(Settings(), "postgresql://unused", "projections")
    runtime.app = SimpleNamespace(consumer_generation_id=5)
    step = Applied()
    runtime.steps, runtime.sealers = {"applied": (step, Open())}, {"t": Plain()}
    await runtime.revoke([])
    runtime.assigned()  # a member rejoining a stable group keeps its generation
    await runtime.run_batch(["applied"], [event(0, 5)])
    assert step.offsets == [0]


class Throttles(OfflineTurnExtractor):
    """Throttled on every call, after ``at`` has been set."""

    def __init__(self):
        super().__init__()
        self.asked, self.at = 0, asyncio.Event()

    async def extract_turn(self, turn):
        self.asked += 1
        self.at.set()
        await asyncio.sleep(0.05)
        raise Throttled("a quota, for the test")


async def abandon_then_fail(model, error: Exception):
    """``model.formation`` asked to abandon its work (``model.abandoning``), and ``error`` raised
    as the cancel lands: a client turning the cancel into its own error."""
    model.abandoning = asyncio.ensure_future(model.formation.abandon())
    try:
        await asyncio.sleep(1)
    except asyncio.CancelledError:
        pass
    raise error


class FailsAsAbandoned(OfflineExtractor):
    """Asks ``formation`` to abandon its work on the first call, and fails as the cancel lands
    (a client turning the cancel into its own error); as the facts extractor or the turn's."""

    def __init__(self):
        self.calls, self.formation, self.turns = 0, None, OfflineTurnExtractor()
        self.model_id = self.relations_model_id = "fails-as-abandoned"

    async def _first(self):
        self.calls += 1
        if self.calls == 1:
            await abandon_then_fail(self, Throttled("a quota, for the test"))

    async def extract(self, turn):
        await self._first()
        return await super().extract(turn)

    async def extract_turn(self, turn):
        await self._first()
        return await self.turns.extract_turn(turn)


@pytest.mark.parametrize("call", ["extraction of facts", "one extraction for the turn"])
async def test_a_turn_cancelled_as_its_model_call_fails_is_not_retried(call):
    model = FailsAsAbandoned()
    turn_model = model if call == "one extraction for the turn" else None
    f = model.formation = Formation(producer=None, decisions_topic="d", embedder=Scattered(), extractor=model,
                                    resolver=OfflineResolver(), dead_letters=None, pool=None, barrier=None,
                                    record_position=False, turn_extractor=turn_model)
    await f.start([turn(0)])
    await asyncio.wait_for(abandoned(model), 5)
    await asyncio.sleep(0.5)  # past the retry's backoff
    assert model.calls == 1


def turn(offset: int) -> Record:
    t = TurnRecorded.new(user_id="u", conversation_id="c", user_message="I live in Oslo.", assistant_message="Ok.",
                         occurred_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    return Record("events", 0, offset, b"u", encode(t), (), 1_700_000_000_000)


async def test_process_raises_for_what_was_abandoned():
    model = Throttles()
    f = Formation(producer=None, decisions_topic="d", embedder=Scattered(), extractor=None,
                  resolver=OfflineResolver(), dead_letters=None, pool=None, barrier=None, turn_extractor=model,
                  record_position=False)
    processing = asyncio.ensure_future(f.process([turn(0)]))
    await asyncio.wait_for(model.at.wait(), 5)
    await asyncio.wait_for(f.abandon(), 5)
    with pytest.raises(Abandoned):
        await asyncio.wait_for(processing, 5)
    asked = model.asked
    await asyncio.sleep(0.2)
    assert model.asked == asked  # nothing of it still running


async def abandoned(model) -> None:
    """Once the model's first call has asked formation to abandon (its first call comes after an
    embedding in a thread: no fixed sleep is long enough on every machine), until that is done."""
    while getattr(model, "abandoning", None) is None:
        await asyncio.sleep(0.005)
    await model.abandoning
