"""API keys: shown once, kept hashed, scoped to a tenant's users (no stack needed)."""
import json
import stat

import pytest

from memstream.api.keys import ApiKeys
from memstream.schemas import TurnRecorded
from memstream.schemas.codec import validated
from memstream.schemas.errors import InvalidArgument, InvalidEvent


def test_a_key_is_kept_only_as_its_hash_and_reaches_its_tenants_users_only(tmp_path):
    keys = ApiKeys(tmp_path / "api-keys.json")
    acme, ops = keys.create("acme app", tenant="acme"), keys.create("ops")
    stored = (tmp_path / "api-keys.json").read_text()
    assert acme not in stored and ops not in stored and json.loads(stored)
    assert stat.S_IMODE((tmp_path / "api-keys.json").stat().st_mode) == 0o600
    who = keys.principal(acme)
    assert who.tenant == "acme" and not who.operator
    assert who.reaches("acme:ana") and not who.reaches("acme-corp:ana") and not who.reaches("globex:ana")
    assert not who.reaches("acme") and not who.reaches("__memstream__")
    assert keys.principal(ops).operator and keys.principal(ops).reaches("globex:ana")
    assert keys.principal("msk_" + "x" * 43) is None and keys.principal(None) is None and keys.principal(acme[4:]) is None


@pytest.mark.parametrize("tenant", ["", "Acme", "a:b", "x" * 64, "-a"])
def test_a_tenant_name_cannot_overlap_another_tenants_user_ids(tmp_path, tenant):
    with pytest.raises(InvalidArgument):
        ApiKeys(tmp_path / "k.json").create("x", tenant=tenant)


def test_an_id_with_a_nul_is_refused_at_the_edge_not_by_postgres_in_a_worker():
    for ids in ({"user_id": "u\x00"}, {"user_id": "u", "conversation_id": "c\x00"}):
        with pytest.raises(InvalidEvent, match="NUL"):
            validated(TurnRecorded.new(**{"user_id": "u", "conversation_id": "c", **ids},
                                       user_message="hi", assistant_message="ok"))


def test_a_session_key_signs_in_for_its_process_only_and_is_written_nowhere(tmp_path):
    keys = ApiKeys(tmp_path / "k.json")
    link = keys.session_key("demo inspector")
    assert keys.principal(link).operator and not (tmp_path / "k.json").exists()
    assert ApiKeys(tmp_path / "k.json").principal(link) is None  # another process: refused


def test_keys_made_and_revoked_by_several_processes_at_once_are_all_kept(tmp_path):
    """Each process reads, changes and writes the file: without a lock the last write won, and
    a revoked key came back or a made one was lost."""
    import multiprocessing

    made = ApiKeys(tmp_path / "k.json")
    ids = [made.list()[-1]["id"] for _ in range(4) if made.create("old")]
    ctx = multiprocessing.get_context("spawn")  # not fork: the test process has threads (a lock held at the fork)
    go = ctx.Event()  # every process started before any of them writes
    workers = [ctx.Process(target=_revoke, args=(go, tmp_path / "k.json", i)) for i in ids] + \
        [ctx.Process(target=_create, args=(go, tmp_path / "k.json", n)) for n in range(4)]
    for w in workers:
        w.start()
    go.set()
    for w in workers:
        w.join(60)
    listed = ApiKeys(tmp_path / "k.json").list()
    assert sorted(k["name"] for k in listed) == ["new-0", "new-1", "new-2", "new-3"] + ["old"] * 4
    assert all(not k["active"] for k in listed if k["name"] == "old")


def _revoke(go, path, key_id):
    go.wait(30)
    ApiKeys(path).revoke(key_id)


def _create(go, path, n):
    go.wait(30)
    ApiKeys(path).create(f"new-{n}")
