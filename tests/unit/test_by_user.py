"""``ByUser``: a mapping of ``(user_id, id)`` kept per user, whose forks share rows until written."""
import pytest

from memstream.streams.worker.formation.by_user import ByUser


def test_forks_share_rows_until_either_side_writes_a_users_and_then_keep_their_own():
    parent = ByUser()
    parent.mine("u")[("u", 1)] = "a"
    parent.mine("v")[("v", 1)] = "b"
    first, second = parent.fork(), parent.fork()
    first.mine("u")[("u", 2)] = "first"
    parent.mine("u")[("u", 3)] = "parent"
    second.fork().mine("v")[("v", 2)] = "grandchild"
    assert dict(first) == {("u", 1): "a", ("u", 2): "first", ("v", 1): "b"}
    assert dict(parent) == {("u", 1): "a", ("u", 3): "parent", ("v", 1): "b"}
    assert dict(second) == {("u", 1): "a", ("v", 1): "b"}
    assert dict(parent.of("v")) == {("v", 1): "b"} and len(parent) == 3


@pytest.mark.parametrize("odd", [None, 5, (), ("nobody", 1), "u"])
def test_a_key_no_user_holds_is_missing_like_a_dicts(odd):
    rows = ByUser()
    rows.mine("u")[("u", 1)] = "a"
    assert odd not in rows and rows.get(odd, "default") == "default"
    with pytest.raises(KeyError):
        rows[odd]
    with pytest.raises(TypeError):
        rows.of("u")[("u", 2)] = "b"  # read-only: a fork may share it
