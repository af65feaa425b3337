"""A turn the model cannot answer is given up — its episode kept, the turn dead-lettered — after
its attempts, on every path formation asks the model by; and a refusal never stops the worker,
not even as partitions are revoked (fakes for Kafka and the model, no stack; the real stack:
``tests/integration/test_pipelined_formation.py``)."""
import asyncio
import collections
import contextlib
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from memstream.llm.offline import OfflineExtractor, OfflineResolver
from memstream.llm.offline_relations import OfflineTurnExtractor
from memstream.llm.protocols import MalformedOutput, ModelFailed, ModelRefused, ModelUnavailable
from memstream.schemas import TurnRecorded
from memstream.schemas.codec import decode_decision, encode
from memstream.streams.worker.formation.pipeline import Formation, decode_turns
from memstream.streams.worker.formation.graph import GraphView
from memstream.streams.worker.formation.views import MemoryView
from memstream.streams.log.records import Record
from tests.unit.test_giving_up import abandon_then_fail
from tests.unit.test_turn_resolution import Scattered


class Produced:
    """The decisions topic, as a list."""

    def __init__(self):
        self.decisions = []

    async def send(self, topic, value, key=None, partition=None):
        self.decisions.append(decode_decision(value))
        done = asyncio.get_running_loop().create_future()
        done.set_result(SimpleNamespace(partition=partition, offset=len(self.decisions) - 1))
        return done


class Letters:
    def __init__(self):
        self.letters = []

    async def send(self, letters):
        self.letters += letters

    def observe(self, n_ok):
        pass


def turn(offset: int, said: str, user: str = "u") -> Record:
    t = TurnRecorded.new(user_id=user, conversation_id="c", user_message=said, assistant_message="Ok.",
                         occurred_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    return Record("events", 0, offset, user.encode(), encode(t), (), 1_700_000_000_000)


class Unreadable(OfflineExtractor):
    """The offline model, as the facts extractor or the turn's: a turn saying "garbled" answered
    with ``error`` every time, one saying "filtered" refused (a content filter)."""

    def __init__(self, error=MalformedOutput):
        self.error, self.turns, self.asked = error, OfflineTurnExtractor(), collections.Counter()
        self.model_id = self.relations_model_id = "unreadable"

    async def _read(self, turn):
        self.asked[turn.user_message] += 1
        if "garbled" in turn.user_message:
            raise self.error("for the test")
        if "filtered" in turn.user_message:
            raise ModelRefused("the model stopped: content_filtered")

    async def extract(self, turn):
        await self._read(turn)
        return await super().extract(turn)

    async def extract_turn(self, turn):
        await self._read(turn)
        return await self.turns.extract_turn(turn)


def formation(model, *, turn_model: bool, attempts: int, **kw) -> tuple[Formation, Produced, Letters]:
    produced, letters = Produced(), Letters()
    f = Formation(producer=produced, decisions_topic="d", embedder=Scattered(), extractor=model,
                  resolver=OfflineResolver(), dead_letters=letters, pool=None, barrier=None, record_position=False,
                  turn_extractor=model if turn_model else None, model_attempts=attempts, **kw)
    return f, produced, letters


@pytest.mark.parametrize("turn_model", [True, False], ids=["one extraction for the turn", "extraction of facts"])
@pytest.mark.parametrize("error", [MalformedOutput, ModelFailed])
async def test_a_turn_left_unanswered_is_given_up_after_its_attempts(turn_model, error):
    model = Unreadable(error)
    f, produced, letters = formation(model, turn_model=turn_model, attempts=3)
    await asyncio.wait_for(f.process([turn(0, "garbled, said in Oslo.")]), 10)  # backoff: 0.2 + 0.4 s
    assert model.asked == {"garbled, said in Oslo.": 3}
    assert [type(d).__name__ for d in produced.decisions] == ["EpisodeRecorded"]
    [(record, stage, reason)] = letters.letters
    assert (record.offset, stage) == (0, "formation")
    assert "in 3 attempts" in reason and "Oslo" not in reason


async def test_a_refusal_is_not_asked_again_and_reform_gives_it_up_too():
    model = Unreadable()
    f, produced, letters = formation(model, turn_model=True, attempts=5)
    filtered = turn(0, "filtered: something")
    await asyncio.wait_for(f.process([filtered]), 10)
    assert model.asked == {"filtered: something": 1}
    assert [type(d).__name__ for d in produced.decisions] == ["EpisodeRecorded"]
    assert [(stage, reason) for _, stage, reason in letters.letters] == [
        ("formation", "its episode recorded without facts or relations: the model stopped: content_filtered")]
    # ``decide`` (reform's), without the pipeline: the same decisions and letter.
    turns, _ = decode_turns([filtered], "reform")
    letters_too: list = []
    made = await f.decide(turns, MemoryView("m"), GraphView(None), letters=letters_too)
    assert [d for _, d in made] == produced.decisions
    assert [(s, why) for _, s, why in letters_too] == [(s, why) for _, s, why in letters.letters]


class FailsAsAbandoned(Unreadable):
    """Asks ``formation`` to abandon its work on the first call, and answers garbled as the
    cancel lands — the turn's last allowed attempt (a client turning the cancel into its error)."""

    formation = abandoning = None

    async def _read(self, turn):
        self.asked[turn.user_message] += 1
        await abandon_then_fail(self, MalformedOutput("for the test"))


@pytest.mark.parametrize("turn_model", [True, False], ids=["one extraction for the turn", "extraction of facts"])
async def test_a_turn_given_up_as_its_partitions_are_revoked_stops_nothing(turn_model):
    model, fatal = FailsAsAbandoned(), []
    f, produced, letters = formation(model, turn_model=turn_model, attempts=1, on_fatal=fatal.append)
    model.formation = f
    await f.start([turn(0, "garbled")])
    await asyncio.wait_for(abandoned(model), 5)
    await asyncio.sleep(0.3)
    assert (fatal, produced.decisions, letters.letters, model.asked) == ([], [], [], {"garbled": 1})


class NoRowsYet:
    """A store nobody has written to yet (the facts and graph formation looks up)."""

    @contextlib.asynccontextmanager
    async def acquire(self):
        yield self

    async def fetch(self, *args):
        return []

    async def fetchval(self, *args):
        return False


async def test_a_turn_the_models_service_keeps_failing_is_given_up_once_it_answers_others():
    """A deterministic 500 or timeout for one turn: given up like a refusal, so it holds up
    neither its partition nor the worker; the other user's turn is formed meanwhile."""
    model = Unreadable(ModelUnavailable)
    f, produced, letters = formation(model, turn_model=True, attempts=3)
    f.turns.pool = NoRowsYet()
    await asyncio.wait_for(f.process([turn(0, "garbled, said in Oslo.", "ana"), turn(1, "I live in Porto.", "bo")]), 20)
    assert model.asked["garbled, said in Oslo."] >= 3
    assert {(d.user_id, type(d).__name__) for d in produced.decisions} >= {("ana", "EpisodeRecorded"), ("bo", "FactAdded")}
    [(record, stage, reason)] = letters.letters
    assert record.offset == 0 and "answered others" in reason


async def test_an_outage_of_the_models_service_waits_and_gives_up_no_turn():
    model = Unreadable(ModelUnavailable)
    f, produced, letters = formation(model, turn_model=True, attempts=2)
    with pytest.raises(asyncio.TimeoutError):  # every call fails: nobody's turn is the one at fault
        await asyncio.wait_for(f.process([turn(0, "garbled in Oslo.", "ana"), turn(1, "garbled in Porto.", "bo")]), 2)
    assert letters.letters == [] and produced.decisions == []


async def abandoned(model) -> None:
    """Once the model's first call has asked formation to abandon (its first call comes after an
    embedding in a thread: no fixed sleep is long enough on every machine), until that is done."""
    while getattr(model, "abandoning", None) is None:
        await asyncio.sleep(0.005)
    await model.abandoning


async def test_a_reflection_request_the_models_service_keeps_failing_is_dead_lettered_and_stops_nothing():
    """One cluster answered, the other failing each time: the request is given up like a turn
    (nothing of it recorded, dead-lettered with why), not raised at the worker, which would stop
    on it at every restart."""
    import uuid

    from memstream.llm.offline_reflection import OfflineReflector
    from memstream.schemas import ReflectRequested, ReflectionCluster
    from memstream.schemas.events import new_event_id

    class FailsOnKayaks(OfflineReflector):
        async def reflect(self, memories):
            if any("kayak" in m for m in memories):
                raise ModelUnavailable("for the test")
            return await super().reflect(memories)

    said = [turn(i, f"I like {what}.", "ana") for i, what in enumerate(["hiking", "camping", "kayaking", "rowing"])]
    learned, _, _ = formation(OfflineExtractor(), turn_model=False, attempts=2)
    learned.turns.pool = NoRowsYet()
    made = await learned.decide(decode_turns(said, "formation")[0], MemoryView("m"), GraphView(None))
    facts = [d.fact_id for _, d in made if type(d).__name__ == "FactAdded"]
    assert len(facts) == 4
    asked = ReflectRequested(event_id=new_event_id(), user_id="ana", occurred_at=datetime(2026, 1, 2, tzinfo=timezone.utc),
                             actor="operator", sweep_id=uuid.uuid4(), policy="reflect-v3", clusters=[
                                 ReflectionCluster(sources=facts[:2], observations=2),
                                 ReflectionCluster(sources=facts[2:], observations=2)])
    fatal: list = []
    f, produced, letters = formation(OfflineExtractor(), turn_model=False, attempts=2, reflector=FailsOnKayaks(),
                                     on_fatal=fatal.append)
    f.turns.pool = NoRowsYet()
    request = Record("events", 0, len(said), b"ana", encode(asked), (), 1_700_000_000_000)
    await asyncio.wait_for(f.process([*said, request]), 20)
    assert fatal == [] and not any(type(d).__name__ == "ReflectionRecorded" for d in produced.decisions)
    assert sum(type(d).__name__ == "FactAdded" for d in produced.decisions) == 4  # the turns are formed
    [(record, stage, reason)] = letters.letters
    assert record.offset == len(said) and stage == "formation" and "the model refused it" in reason
