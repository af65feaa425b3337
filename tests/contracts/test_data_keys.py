"""Per-user data keys, one suite run against each place wrapped keys live: seal and open, bound
to the user and the field, and forgetting that holds (a destroyed key opens nothing, a user who
comes back gets a new one)."""
from __future__ import annotations

import pytest

from memstream.sealing.kek import LocalKek
from memstream.sealing.keys import DataKeys, MemoryWrappedKeys, NotSealed, PostgresWrappedKeys, Shredded, user_key

pytestmark = pytest.mark.asyncio


class DataKeysContract:
    async def keys(self, tmp_path) -> DataKeys:
        raise NotImplementedError

    async def test_what_is_sealed_opens_for_its_user_and_field_only(self, tmp_path):
        keys = await self.keys(tmp_path)
        sealed = await keys.seal("ana", b"I live in Lisbon", "TurnRecorded.user_message")
        assert b"Lisbon" not in sealed
        assert await keys.open("ana", sealed, "TurnRecorded.user_message") == b"I live in Lisbon"
        await keys.seal("bo", b"x", "f")  # bo has a key of his own: ana's blob does not open with it
        with pytest.raises((NotSealed, Shredded)):
            await keys.open("bo", sealed, "TurnRecorded.user_message")
        with pytest.raises(NotSealed):
            await keys.open("ana", sealed, "TurnRecorded.assistant_message")
        with pytest.raises(NotSealed):
            await keys.open("ana", b"plain JSON", "f")

    async def test_a_destroyed_key_opens_nothing_and_a_returning_user_gets_a_new_one(self, tmp_path):
        keys = await self.keys(tmp_path)
        old = await keys.seal("ana", b"old secret", "f")
        kept = await keys.seal("bo", b"bo's", "f")
        await keys.destroy("ana")
        with pytest.raises(Shredded):
            await keys.open("ana", old, "f")
        new = await keys.seal("ana", b"new", "f")
        assert await keys.open("ana", new, "f") == b"new"
        with pytest.raises(Shredded):  # never the old key again
            await keys.open("ana", old, "f")
        assert await keys.open("bo", kept, "f") == b"bo's"

    async def test_another_process_with_the_same_store_and_kek_opens_it(self, tmp_path):
        a = await self.keys(tmp_path)
        sealed = await a.seal("ana", b"shared", "f")
        b = DataKeys(LocalKek(tmp_path / "kek"), a._store)
        assert await b.open("ana", sealed, "f") == b"shared"
        await b.destroy("ana")
        fresh = DataKeys(LocalKek(tmp_path / "kek"), a._store)
        with pytest.raises(Shredded):
            await fresh.open("ana", sealed, "f")

    async def test_destroying_a_named_generation_spares_a_newer_one(self, tmp_path):
        keys = await self.keys(tmp_path)
        first = await keys.seal("ana", b"first", "f")
        assert await keys.generation("ana") == 1 and await keys.generation("nobody") == 0
        await keys.destroy("ana", 1)
        second = await keys.seal("ana", b"second", "f")
        await keys.destroy("ana", 1)  # the same forget again: generation 2 lives on
        assert await keys.generation("ana") == 2 and await keys.open("ana", second, "f") == b"second"
        with pytest.raises(Shredded):
            await keys.open("ana", first, "f")
        other = DataKeys(LocalKek(tmp_path / "kek"), keys._store)  # held generation 1 would be stale
        assert await other.open("ana", second, "f") == b"second"

    async def test_a_users_last_forget_is_known_as_of_when_it_was_first_said(self, tmp_path):
        keys = await self.keys(tmp_path)
        await keys.seal("ana", b"x", "f")
        assert await keys.last_forgets(["ana", "bo"]) == {}
        await keys.stamp("ana", b"1" * 16, at=1_700_000_000.0)
        await keys.stamp("ana", b"1" * 16, at=1_800_000_000.0)  # the same forget sealed again: its first time stays
        assert await keys.last_forgets(["ana", "bo"]) == {"ana": 1_700_000_000.0}
        await keys.stamp("ana", b"2" * 16)  # a second forget, said now
        assert (await keys.last_forgets(["ana"]))["ana"] > 1_700_000_000.0

    async def test_the_store_holds_no_user_id(self, tmp_path):
        keys = await self.keys(tmp_path)
        await keys.seal("ana@example.com", b"x", "f")
        assert await keys._store.current(user_key("ana@example.com")) is not None


class TestMemoryWrappedKeys(DataKeysContract):
    async def keys(self, tmp_path):
        return DataKeys(LocalKek(tmp_path / "kek"), MemoryWrappedKeys())


class TestPostgresWrappedKeys(DataKeysContract):
    @pytest.fixture(autouse=True)
    def _pool(self, pool, schema):
        self._p, self._schema = pool, schema

    async def keys(self, tmp_path):
        store = PostgresWrappedKeys(self._p, self._schema)
        await store.migrate()
        return DataKeys(LocalKek(tmp_path / "kek"), store)

    async def test_no_row_names_the_user(self, tmp_path):
        keys = await self.keys(tmp_path)
        await keys.seal("ana@example.com", b"x", "f")
        rows = await self._p.fetch(f"SELECT * FROM {self._schema}.data_keys")
        assert len(rows) == 1 and b"ana" not in bytes(rows[0]["user_key"]) and b"ana" not in bytes(rows[0]["wrapped"])
