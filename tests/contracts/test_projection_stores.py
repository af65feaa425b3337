"""The ``ProjectionStore`` contract (``projections/base.py``) against every store: episodes,
facts, graph and commands, each in its own schema, fed realistic items (decisions, or for
commands the events hosts put on the log)."""
from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import asyncpg
import msgspec
import numpy as np
import pytest

from memstream.embedding import to_bytes
from memstream.projections.base import ProjectionStore
from memstream.projections.commands.core import Logged, UnknownReminder
from memstream.projections.commands.store import CommandStore
from memstream.projections.compare import TABLES
from memstream.projections.episodes import core as episodes
from memstream.projections.episodes.store import EpisodeStore
from memstream.projections.facts import core as facts
from memstream.projections.facts.core import MissingTarget
from memstream.projections.facts.store import FactStore
from memstream.projections.graph import core as graph
from memstream.projections.graph.core import EdgeRow, MissingGraphTarget
from memstream.projections.graph.store import GraphStore
from memstream.schemas import EdgeOpened, EntityCreated, EpisodesSwept, FactAdded, FactUpdated, MemoryForgotten, ReminderScheduled
from memstream.schemas.errors import Refused
from tests.contracts import items
from tests.contracts.items import EVENTS

DECISIONS = "contract.decisions"


def pytest_generate_tests(metafunc):
    if "poison" in metafunc.fixturenames:
        metafunc.parametrize("poison", metafunc.cls.poisons)


async def positions(conn, projection: str) -> dict[tuple[str, int], int]:
    return {(r["topic"], r["partition"]): r["next_offset"] for r in await conn.fetch(
        "SELECT topic, partition, next_offset FROM projection_positions WHERE projection = $1", projection)}


async def snapshot(conn, tables) -> dict[str, list[str]]:
    """Every row of ``tables`` and of ``projection_positions``, as sorted JSON (generated columns included)."""
    return {t: [r[0] for r in await conn.fetch(f"SELECT to_jsonb(t)::text FROM {t} t ORDER BY 1")]
            for t in [*tables, "projection_positions"]}


class ProjectionStoreContract:
    """The behaviour, once; a subclass names the store, its tables and a factory of its items."""

    store: ProjectionStore
    tables: list[str]  # every table the store writes
    topic = DECISIONS  # the topic its items come from
    poisons: tuple[str, ...]  # names of the batches ``poisoned`` makes

    def batch(self) -> list:
        """Items of several users that fill every one of ``tables``, in log order."""
        raise NotImplementedError

    def poisoned(self, name: str, batch: list) -> tuple[list, type[BaseException]]:
        """A batch to apply after ``batch`` whose last item makes the store raise (the error it
        raises): the items before it change rows ``batch`` made, or add new ones."""
        raise NotImplementedError

    @pytest.fixture
    async def conn(self, pool):
        async with pool.acquire() as c:
            yield c

    async def test_a_batch_applied_twice_leaves_the_store_as_applied_once(self, conn):
        batch, at = self.batch(), {(self.topic, 0): 40}
        await self.store.apply_batch(conn, batch, at)
        once = await snapshot(conn, self.tables)
        assert all(once.values()), {t: len(rows) for t, rows in once.items()}
        await self.store.apply_batch(conn, batch, at)
        assert await snapshot(conn, self.tables) == once

    async def test_a_redelivered_prefix_at_an_older_position_changes_nothing(self, conn):
        batch = self.batch()
        await self.store.apply_batch(conn, batch, {(self.topic, 0): 40})
        before = await snapshot(conn, self.tables)
        await self.store.apply_batch(conn, batch[:len(batch) // 2], {(self.topic, 0): 20})
        assert await snapshot(conn, self.tables) == before  # positions included: still at 40

    async def test_positions_only_move_forward_each_partition_on_its_own(self, conn):
        batch = self.batch()
        half = len(batch) // 2
        await self.store.apply_batch(conn, [], {(self.topic, 0): 2})  # an empty batch moves positions only
        rows = await snapshot(conn, self.tables)
        assert not any(rows[t] for t in self.tables)
        assert await positions(conn, self.store.name) == {(self.topic, 0): 2}
        await self.store.apply_batch(conn, batch[:half], {(self.topic, 0): 8, (self.topic, 1): 3})
        await self.store.apply_batch(conn, batch[half:], {(self.topic, 0): 5, (self.topic, 1): 9, (EVENTS, 2): 4})
        assert await positions(conn, self.store.name) == {(self.topic, 0): 8, (self.topic, 1): 9, (EVENTS, 2): 4}

    async def test_a_batch_that_raises_writes_nothing(self, conn, poison):
        batch = self.batch()
        await self.store.apply_batch(conn, batch, {(self.topic, 0): 40})
        before = await snapshot(conn, self.tables)
        bad, error = self.poisoned(poison, batch)
        with pytest.raises(error):
            await self.store.apply_batch(conn, bad, {(self.topic, 0): 50, (self.topic, 1): 7})
        assert await snapshot(conn, self.tables) == before


class TestEpisodeStore(ProjectionStoreContract):
    store, tables = EpisodeStore(), TABLES["episodes"]
    poisons = ("text Postgres refuses", "embedding of another size")

    def batch(self):
        said = [("ana", "I live in Porto."), ("bo", "My cat is called Miso."), ("ana", "I moved to Lisbon.")]
        regret = items.episode("cy", "Forget I said this.")
        long = items.episode("bo", "A long turn about my garden, my roses and my tomatoes.", passages=2)
        rows = [episodes.apply(items.episode(user, text)) for user, text in said]
        return [*rows, episodes.apply(long), episodes.apply(regret), _forget(regret, "episode"),
                # Each user's own episodes move (ana's id in bo's sweep is not bo's), and back.
                _swept("bo", long, cooled=[rows[0].episode_id, episodes.episode_id(long.source_event_id)]),
                _swept("ana", long, cooled=[rows[0].episode_id, rows[2].episode_id]),
                _swept("ana", long, warmed=[rows[0].episode_id])]

    def poisoned(self, name, batch):
        fresh = episodes.apply(items.episode("ana", "I started a new job."))
        if name == "text Postgres refuses":
            return [fresh, episodes.apply(items.episode("bo", "bad \x00 byte"))], asyncpg.CharacterNotInRepertoireError
        return [fresh, replace(episodes.apply(items.episode("bo", "ok")), embedding=to_bytes(np.ones(383)))], \
            asyncpg.DataError

    async def test_a_turn_on_the_log_again_after_its_forget_stays_forgotten_until_its_user_is(self, conn):
        said = items.episode("ana", "My test came back positive.")
        row = episodes.apply(said)
        done = await self.store.apply_batch(conn, [row, _forget(said, "episode"), row], {})
        again = await self.store.apply_batch(conn, [row], {})  # a retried dead letter, a batch later
        assert done.kept_out == again.kept_out == {("ana", row.episode_id)}
        assert await conn.fetchval("SELECT count(*) FROM episodes WHERE user_id = 'ana'") == 0
        await self.store.apply_batch(conn, [_forget(said, "user")], {})
        assert await conn.fetchval("SELECT count(*) FROM forgotten_episodes WHERE user_id = 'ana'") == 0


def _swept(user: str, said, cooled=(), warmed=()) -> EpisodesSwept:
    return EpisodesSwept(decision_id=uuid.uuid4(), source_event_id=uuid.uuid4(), source=said.source,
                         recorded_at=said.recorded_at, user_id=user, sweep_id=uuid.uuid4(),
                         swept_at=said.recorded_at, cooled=list(cooled), warmed=list(warmed))


def _forget(said, kind: str) -> MemoryForgotten:
    return MemoryForgotten(decision_id=uuid.uuid4(), source_event_id=uuid.uuid4(), source=said.source,
                           recorded_at=said.recorded_at, user_id=said.user_id, actor="user", kind=kind,
                           target=said.source_event_id if kind == "episode" else None)


class TestFactStore(ProjectionStoreContract):
    store, tables = FactStore(), TABLES["facts"] + TABLES["profile"]  # profiles: rebuilt in its transaction
    poisons = ("an update of an unknown fact", "text Postgres refuses")

    def batch(self):
        likes, home, pet = items.added(), items.added(attribute="home", value="Porto", category="location"), \
            items.added(attribute="pet", value="cat")
        tea, chess = items.added("bo", value="tea"), items.added("bo", value="chess")
        # Reflections drawn from a fact and turns: one is forgotten with a turn, the other stays.
        kept, gone = items.reflected([likes], [uuid.uuid4()]), items.reflected([likes], [uuid.uuid4()])
        turn_forgotten = msgspec.structs.replace(_forget(gone, "episode"), target=gone.turns[0], keep_derived=True)
        return [likes, home, pet, items.reinforced(likes), items.deferred(likes, "blues"),
                items.updated(home, "Lisbon"), items.deleted(pet), tea, items.refused(), chess,
                items.archived(tea), items.archived(chess), items.restored(chess), kept, gone, turn_forgotten]

    def poisoned(self, name, batch):
        home = next(d for d in batch if isinstance(d, FactUpdated))
        likes = next(d for d in batch if isinstance(d, FactAdded))
        changes = [items.updated(home, "Berlin"), items.reinforced(likes),
                   items.added("bo", attribute="pet", value="dog")]
        if name == "an update of an unknown fact":
            return [*changes, items.updated(items.added(), "swing")], MissingTarget
        return [*changes, items.added(value="bad \x00 byte")], asyncpg.CharacterNotInRepertoireError

    async def test_an_update_backdated_past_stored_versions_ends_them_as_the_core_does(self, conn):
        porto = items.added(attribute="home", value="Porto", category="location")
        lisbon = items.updated(porto, "Lisbon")
        madrid = msgspec.structs.replace(items.updated(lisbon, "Madrid"),
                                         valid_from=porto.valid_from + timedelta(seconds=30))
        await self.store.apply_batch(conn, [porto, lisbon], {})
        await self.store.apply_batch(conn, [madrid], {})  # Porto's version is read back from Postgres
        folded = facts.fold({}, [porto, lisbon, madrid])
        rows = await conn.fetch("SELECT fact_id, valid_from, valid_to FROM memory_facts WHERE user_id = 'ana' "
                                "AND lineage_id = $1 ORDER BY version", porto.fact_id)
        assert [tuple(r) for r in rows] == [(r.fact_id, r.valid_from, r.valid_to)
                                            for r in sorted(folded.values(), key=lambda r: r.version)]
        assert rows[0]["valid_to"] == madrid.valid_from  # Porto ends where Madrid begins


class TestGraphStore(ProjectionStoreContract):
    store, tables = GraphStore(), TABLES["graph"]
    # The last breaks a constraint Postgres checks at commit (deferred), after every row is written.
    poisons = ("a close of an unknown edge", "two current edges of a single-valued relation")

    def batch(self):
        ana, acme, bo = items.entity("ana", "Ana", is_user=True), items.entity("ana", "Acme"), \
            items.entity("bo", "Bo", is_user=True)
        porto = items.edge(ana, "lives_in", value="Porto")
        return [ana, acme, items.alias(acme, "Acme Corp"), items.edge(ana, "works_at", target=acme), porto,
                items.closed(porto, days=30), items.edge(ana, "lives_in", value="Lisbon", days=30),
                items.edge(ana, "friend_of", value="Bo", multi_valued=True), bo,
                items.edge(bo, "likes", value="tea", multi_valued=True)]

    def poisoned(self, name, batch):
        ana, acme = [d for d in batch if isinstance(d, EntityCreated)][:2]
        works = next(d for d in batch if isinstance(d, EdgeOpened) and d.relation == "works_at")
        changes = [items.alias(acme, "ACME Inc"), items.closed(works, days=40), items.edge(ana, "owns", value="a bike")]
        if name == "a close of an unknown edge":
            return [*changes, items.closed(items.edge(ana, "owns", value="a car"), days=41)], MissingGraphTarget
        return [*changes, items.edge(ana, "lives_in", value="Faro", days=40)], asyncpg.ExclusionViolationError

    async def test_an_edge_backdated_past_stored_edges_ends_them_as_the_core_does(self, conn):
        # Porto until day 150, Lisbon since; then "I have lived in Madrid since day 60" (formation
        # closes Lisbon at its own start): Porto, read back from Postgres, ends on day 60.
        ana = items.entity("ana", "Ana", is_user=True)
        porto = items.edge(ana, "lives_in", value="Porto")
        lisbon = items.edge(ana, "lives_in", value="Lisbon", days=150)
        said = [ana, porto, items.closed(porto, days=150), lisbon]
        madrid = [items.closed(lisbon, days=150), items.edge(ana, "lives_in", value="Madrid", days=60)]
        await self.store.apply_batch(conn, said, {})
        await self.store.apply_batch(conn, madrid, {})  # commits: the overlap constraint holds
        folded = graph.fold({}, [*said, *madrid])
        rows = await conn.fetch("SELECT target_value, valid_from, valid_to FROM memory_edges WHERE user_id = 'ana' "
                                "ORDER BY valid_from, valid_to NULLS LAST")
        assert [tuple(r) for r in rows] == sorted(
            ((r.target_value, r.valid_from, r.valid_to) for r in folded.values() if isinstance(r, EdgeRow)),
            key=lambda r: (r[1], r[2] is None, r[2]))
        assert [tuple(r) for r in rows] == [("Porto", items.T0, madrid[1].valid_from), ("Madrid", madrid[1].valid_from, None),
                                            ("Lisbon", lisbon.valid_from, lisbon.valid_from)]


class TestCommandStore(ProjectionStoreContract):
    store, tables, topic = CommandStore(), TABLES["commands"], EVENTS
    poisons = ("a reminder never scheduled resolved", "text Postgres refuses")

    def batch(self):
        call, water = items.scheduled("ana", "call mum"), items.scheduled("bo", "water the plants")
        return logged(0, [call, water, items.resolved(call), items.identity("ana", name="Ana", tone="brief"),
                          items.expert("coach", "Coach"), items.expert("chef", "Chef"), items.expert_gone("chef"),
                          items.identity("ana", name="Ana", tone="warm"), items.used("ana", uuid.UUID(int=1)),
                          items.used("ana", uuid.UUID(int=1), uuid.UUID(int=2)),
                          items.used("bo", episodes=[uuid.UUID(int=4)])])

    def poisoned(self, name, batch):
        water = [c.event for c in batch if isinstance(c.event, ReminderScheduled)][1]
        # Commands are written one by one: these rows are in the transaction when the last item fails.
        changes = [items.resolved(water, "dismissed"), items.identity("bo", name="Bo"), items.used("bo", uuid.UUID(int=3)),
                   items.scheduled("ana", "dentist"), items.expert("coach", "Head coach")]
        if name == "a reminder never scheduled resolved":
            return logged(len(batch), [*changes, items.resolved(items.scheduled("ana", "never on the log"))]), UnknownReminder
        bad = Unchecked(**msgspec.structs.asdict(items.scheduled("bo", "ok")) | {"text": "bad \x00 byte"})
        return logged(len(batch), [*changes, bad]), asyncpg.CharacterNotInRepertoireError

    async def test_two_users_reminders_with_one_id_are_each_their_own(self, conn):
        # A host that gave two users' events one id gave their reminders one id.
        call = items.scheduled("ana", "call mum")
        plants = msgspec.structs.replace(items.scheduled("bo", "water the plants"), reminder_id=call.reminder_id)
        await self.store.apply_batch(conn, logged(0, [call, plants, items.resolved(plants)]), {})
        rows = await conn.fetch("SELECT user_id, text, status FROM reminders ORDER BY user_id")
        assert [tuple(r) for r in rows] == [("ana", "call mum", "pending"), ("bo", "water the plants", "done")]


class Unchecked(ReminderScheduled, kw_only=True, frozen=True):
    """A reminder as the edge now refuses it (a NUL), for a store to be handed all the same."""

    def __post_init__(self) -> None:
        pass


def logged(first: int, events: list) -> list[Logged]:
    """Commands as the commands projection hands them to its store: with their log offsets."""
    return [Logged(first + n, e) for n, e in enumerate(events)]


def test_a_store_refuses_an_item_naming_a_row_it_lacks_as_refused():
    # The projection steps dead-letter Refused items; anything else stops the worker.
    assert all(issubclass(e, Refused) for e in (MissingTarget, MissingGraphTarget, UnknownReminder))
