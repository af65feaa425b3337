"""Per-user data keys, one suite run against each place wrapped keys live: seal and open, bound
to the user and the field, and forgetting that holds (a destroyed key opens nothing, a user who
comes back gets a new one)."""
from __future__ import annotations

import pytest

from memstream.keys.kek import KekRefused, LocalKek
import asyncio

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from memstream.keys.data_keys import _HEAD, MAGIC, DataKeys, NotSealed, Shredded, _aad, generation_of, user_key
from memstream.keys.wrapped import MemoryWrappedKeys, PostgresWrappedKeys
from memstream.keys.rotation import rotate

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

    async def test_a_forget_retires_the_live_key_and_what_comes_after_it_gets_the_next(self, tmp_path):
        keys = await self.keys(tmp_path)
        before = await keys.seal("ana", b"before", "f")
        assert await keys.stamp("ana", b"1" * 16) == 1
        after = await keys.seal("ana", b"after", "f")  # said after the forget, before the key is destroyed
        assert generation_of(after) == 2 and await keys.generation("ana") == 2
        other = DataKeys(LocalKek(tmp_path / "kek"), keys._store)  # a process that never held a key of hers
        assert generation_of(await other.seal("ana", b"elsewhere", "f")) == 2
        # The retired key still serves what came before the forget: decisions about it are sealed under it.
        derived = await keys.seal("ana", b"about before", "f", generation=1)
        assert await other.open("ana", before, "f") == b"before"
        assert await other.open("ana", derived, "f") == b"about before"
        assert await keys.stamp("ana", b"1" * 16) == 1  # the same forget again retires nothing more
        await keys.destroy("ana", 1)
        for process in (keys, DataKeys(LocalKek(tmp_path / "kek"), keys._store)):
            with pytest.raises(Shredded):
                await process.open("ana", before, "f")
            with pytest.raises(Shredded):
                await process.seal("ana", b"late", "f", generation=1)
            assert await process.open("ana", after, "f") == b"after"
        assert await keys.stamp("ana", b"2" * 16) == 2 and await keys.generation("ana") == 0

    async def test_two_users_forgets_with_one_event_id_each_retire_their_own_key(self, tmp_path):
        """Event ids are unique per user, not across users (hosts reuse them): a forget is the
        user's and its id together, or user B's forget returns user A's generation and B's key
        is never retired or destroyed."""
        keys = await self.keys(tmp_path)
        await keys.seal("ana", b"a", "f")
        await keys.seal("bo", b"b", "f")
        assert await keys.stamp("bo", b"0" * 16) == 1
        bos = await keys.seal("bo", b"said after his first forget", "f")
        assert generation_of(bos) == 2
        assert await keys.stamp("ana", b"1" * 16) == 1
        assert await keys.stamp("bo", b"1" * 16) == 2  # his own generation, not hers
        assert await keys.generation("ana") == await keys.generation("bo") == 0
        await keys.destroy("bo", 2)
        with pytest.raises(Shredded):
            await keys.open("bo", bos, "f")

    async def test_a_forget_that_never_reached_the_log_is_covered_by_the_next_one(self, tmp_path):
        """Stamped (its key retired), then its append failed: the host's retry is a new forget,
        and it must still end the key of what came before, whether or not the user spoke since."""
        keys = await self.keys(tmp_path)
        secret = await keys.seal("ana", b"secret", "f")
        await keys.stamp("ana", b"1" * 16)  # lost
        assert await keys.stamp("ana", b"2" * 16) == 1
        await keys.destroy("ana", 1)
        with pytest.raises(Shredded):
            await keys.open("ana", secret, "f")
        said = await keys.seal("bo", b"bo's", "f")
        await keys.stamp("bo", b"3" * 16)  # lost
        between = await keys.seal("bo", b"said before the retry", "f")
        assert await keys.stamp("bo", b"4" * 16) == 2
        await keys.destroy("bo", 2)
        for blob in (said, between):
            with pytest.raises(Shredded):
                await keys.open("bo", blob, "f")

    async def test_the_store_names_a_user_by_a_digest_no_guess_confirms(self, tmp_path):
        """Keyed: hashing a guessed e-mail address finds nothing; the deployment's processes
        agree on the digest (the secret is in the store, wrapped by the KEK)."""
        keys = await self.keys(tmp_path)
        await keys.seal("ana@example.com", b"x", "f")
        assert await keys.store.current(user_key("ana@example.com")) is None
        assert await keys.store.current(keys.digest("ana@example.com")) is not None
        other = await DataKeys(LocalKek(tmp_path / "kek"), keys.store).ready()
        assert other.digest("ana@example.com") == keys.digest("ana@example.com")

    async def test_a_rotation_wraps_every_key_again_and_retires_the_old_kek(self, tmp_path):
        keys = await self.keys(tmp_path)
        ana = await keys.seal("ana", b"kept", "f")
        bo = await keys.seal("bo", b"forgotten", "f")
        await keys.stamp("bo", b"1" * 16)
        await keys.destroy("bo")
        first = keys.kek.kek_id
        rotation = await rotate(keys)
        assert rotation.retired == [first] and rotation.rewrapped == 1 and rotation.left == 0
        assert not LocalKek(tmp_path / "kek").holds(first)
        for process in (keys, await DataKeys(LocalKek(tmp_path / "kek"), keys.store).ready()):
            assert await process.open("ana", ana, "f") == b"kept"
            with pytest.raises(Shredded):
                await process.open("bo", bo, "f")
        assert generation_of(await keys.seal("bo", b"back", "f")) == 2
        assert await keys.store.stale(keys.kek.kek_id, 10) == []

    async def test_two_rotations_at_once_take_turns_and_lose_nothing(self, tmp_path):
        keys = await self.keys(tmp_path)
        sealed = await keys.seal("ana", b"kept", "f")
        other = await DataKeys(LocalKek(tmp_path / "kek"), keys.store).ready()  # cron on a second host
        await asyncio.gather(rotate(keys), rotate(other))
        fresh = await DataKeys(LocalKek(tmp_path / "kek"), keys.store).ready()
        assert await fresh.open("ana", sealed, "f") == b"kept"
        assert (await keys.store.secret())[0] == fresh.kek.kek_id
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("kek")) == ["kek.3"]

    async def test_a_process_that_wraps_under_a_refused_kek_wraps_again_under_the_new_one(self, tmp_path):
        keys = await self.keys(tmp_path)
        await keys.seal("ana", b"x", "f")
        first = keys.kek.kek_id
        await keys.store.refuse([first])  # a rotation under way elsewhere, its new version not yet made
        keys.REFUSED_TRIES = 2
        with pytest.raises(KekRefused):  # retryable: the worker tries the batch again
            await keys.seal("bo", b"x", "f")
        keys.REFUSED_TRIES = 6

        async def rotated_elsewhere():
            await asyncio.sleep(0.15)
            LocalKek(tmp_path / "kek").rotate()

        elsewhere = asyncio.ensure_future(rotated_elsewhere())
        sealed = await keys.seal("bo", b"y", "f")  # waits, looks again, wraps under the new one
        await elsewhere
        assert await keys.open("bo", sealed, "f") == b"y"
        assert (await keys.store.current(keys.digest("bo")))[1] != first

    async def test_keys_wrapped_before_the_digest_was_keyed_open_and_are_bound_again(self, tmp_path):
        """A store from before: named by SHA-256 of the user id, keys bound to the user id. The
        first process adopts a secret and re-keys it in place; a key is bound to the digest when
        its user is read, or by a rotation given the user ids."""
        kek = LocalKek(tmp_path / "kek")
        old_store = await self.legacy_store(tmp_path, kek, {"ana": b"a" * 32, "bo": b"b" * 32})
        keys = await DataKeys(kek, old_store).ready()
        ana, bo = legacy_blob(b"a" * 32, "ana", b"hers"), legacy_blob(b"b" * 32, "bo", b"his")
        assert await keys.open("ana", ana, "f") == b"hers"
        assert [k.user for k in await keys.store.stale(kek.kek_id, 10)] == [keys.digest("bo")]
        assert (await rotate(keys)).left == 1  # bo's id not given: the old KEK stays
        assert (await rotate(keys, _each(["bo", "someone"]))).left == 0
        fresh = await DataKeys(LocalKek(tmp_path / "kek"), keys.store).ready()
        assert await fresh.open("ana", ana, "f") == b"hers" and await fresh.open("bo", bo, "f") == b"his"
        assert await keys.stamp("bo", b"0" * 16) == 1


    async def test_a_forget_is_looked_up_without_being_stamped(self, tmp_path):
        keys = await self.keys(tmp_path)
        await keys.seal("ana", b"x", "f")
        assert await keys.stamped("ana", b"f" * 16) is None  # looking does not retire the live key
        assert generation_of(await keys.seal("ana", b"y", "f")) == 1
        assert await keys.stamp("ana", b"f" * 16) == 1 and await keys.stamped("ana", b"f" * 16) == 1

    async def test_no_key_is_wrapped_again_under_a_kek_a_rotation_refused(self, tmp_path):
        """A process binding a legacy key to the digest wraps it under the KEK it sees; one that
        still sees the old KEK mid-rotation must not land its wrap between the rotation's scan
        and its own: the old KEK is retired after the scan, and the key would open no more."""
        keys = await self.keys(tmp_path)
        await keys.seal("ana", b"x", "f")
        [key] = await keys.store.stale("a-newer-kek", 10)
        first = keys.kek.kek_id
        await keys.store.refuse([first])
        new_kek, wrapped = keys.kek.wrap(b"k" * 32, "bound")
        assert new_kek == first and await keys.store.rewrapped(key, first, wrapped) is False
        assert [k.kek_id for k in await keys.store.stale("a-newer-kek", 10)] == [first]  # as it was


    async def test_a_process_that_only_seals_lets_go_of_a_forgotten_key(self, tmp_path):
        """A host never reads the forget that ends a key: it lets go of the key once the store
        names a newer one, and of any key it has not used for a while."""
        keys = await self.keys(tmp_path)
        host = DataKeys(LocalKek(tmp_path / "kek"), keys.store, fresh_s=0.0, idle_s=3600)
        await host.seal("ana", b"before", "f")
        await host.seal("bo", b"his", "f")
        await keys.stamp("ana", b"1" * 16)  # elsewhere: the forget, and the destroy
        await keys.destroy("ana", 1)
        assert generation_of(await host.seal("ana", b"after", "f")) == 2
        assert sorted(g for u, g in host._keys if u == host.digest("ana")) == [2]
        host._idle_s = 0.0
        host._held(host.digest("bo"), 1)
        assert not host._keys

async def _each(items):
    for i in items:
        yield i


def legacy_blob(data_key: bytes, user_id: str, plaintext: bytes, context: str = "f") -> bytes:
    """A blob sealed under generation 1 of a key, as every version seals."""
    nonce = b"n" * 12
    return _HEAD.pack(MAGIC, 1, nonce) + AESGCM(data_key).encrypt(nonce, plaintext, _aad(user_id, context))


class TestMemoryWrappedKeys(DataKeysContract):
    async def keys(self, tmp_path):
        return DataKeys(LocalKek(tmp_path / "kek"), MemoryWrappedKeys())

    async def legacy_store(self, tmp_path, kek, data_keys: dict[str, bytes]):
        store = MemoryWrappedKeys()
        for user_id, data_key in data_keys.items():
            await store.create(user_key(user_id), *kek.wrap(data_key, user_id))
        return store


class TestPostgresWrappedKeys(DataKeysContract):
    @pytest.fixture(autouse=True)
    def _pool(self, pool, schema):
        self._p, self._schema = pool, schema

    async def keys(self, tmp_path):
        store = PostgresWrappedKeys(self._p, self._schema)
        await store.migrate()
        return DataKeys(LocalKek(tmp_path / "kek"), store)

    async def legacy_store(self, tmp_path, kek, data_keys: dict[str, bytes]):
        store = PostgresWrappedKeys(self._p, self._schema)
        await store.migrate()
        for user_id, data_key in data_keys.items():
            await store.create(user_key(user_id), *kek.wrap(data_key, user_id))
        await self._p.execute(f"UPDATE {self._schema}.data_keys SET bound_to_user = true")
        return store

    async def test_no_row_names_the_user(self, tmp_path):
        keys = await self.keys(tmp_path)
        await keys.seal("ana@example.com", b"x", "f")
        rows = await self._p.fetch(f"SELECT * FROM {self._schema}.data_keys")
        assert len(rows) == 1 and b"ana" not in bytes(rows[0]["user_key"]) and b"ana" not in bytes(rows[0]["wrapped"])

    async def test_a_key_store_of_one_row_per_user_is_brought_up_to_date_with_its_keys(self, tmp_path):
        """The shape before a forget retired keys: keyed by the user alone. Its keys still open,
        and the next generation follows the one it held."""
        kek_id, wrapped = LocalKek(tmp_path / "kek").wrap(b"a" * 32, "ana")
        sealed, g = legacy_blob(b"a" * 32, "ana", b"kept"), 1
        old = f"{self._schema}_old"
        await self._p.execute(f"DROP SCHEMA IF EXISTS {old} CASCADE; CREATE SCHEMA {old}; "
                              f"CREATE TABLE {old}.data_keys (user_key bytea PRIMARY KEY, generation int NOT NULL, "
                              "kek_id text NOT NULL, wrapped bytea, created_at timestamptz NOT NULL DEFAULT now(), "
                              "destroyed_at timestamptz); "
                              f"CREATE TABLE {old}.forgets (forget bytea PRIMARY KEY, user_key bytea NOT NULL, "
                              "generation int NOT NULL, stamped_at timestamptz NOT NULL DEFAULT now())")
        await self._p.execute(f"INSERT INTO {old}.forgets (forget, user_key, generation) VALUES ($1, $2, 1)",
                              b"0" * 16, user_key("bo"))
        await self._p.execute(f"INSERT INTO {old}.data_keys (user_key, generation, kek_id, wrapped) VALUES ($1, $2, $3, $4)",
                              user_key("ana"), g, kek_id, wrapped)
        try:
            store = PostgresWrappedKeys(self._p, old)
            await store.migrate()
            await store.migrate()  # every process migrates on start
            keys = DataKeys(LocalKek(tmp_path / "kek"), store)
            assert await keys.open("ana", sealed, "f") == b"kept"
            assert await keys.stamp("ana", b"0" * 16) == 1  # bo's forget of that id is his, keyed by forget alone before
            assert await keys.stamp("bo", b"0" * 16) == 1
            assert generation_of(await keys.seal("ana", b"back", "f")) == 2
            assert await keys.open("ana", sealed, "f") == b"kept"
        finally:
            await self._p.execute(f"DROP SCHEMA {old} CASCADE")
