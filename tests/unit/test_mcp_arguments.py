"""The MCP tools refuse a read-your-writes position the API refuses, before any store is asked."""
import pytest

from memstream.mcp_server import _position
from memstream.schemas.errors import InvalidArgument


@pytest.mark.parametrize("after", [
    {"topic": "elsewhere", "partition": 0, "offset": 1},  # a whole position, of another topic
    {"topic": "ev", "partition": 2**31, "offset": 1},  # past the positions table's int
    {"topic": "ev", "partition": 0, "offset": -1},
    {"topic": "ev", "partition": True, "offset": 1},
    {"topic": "ev", "offset": 1},
])
def test_a_position_remember_could_not_have_returned_is_refused(after):
    with pytest.raises(InvalidArgument):
        _position(after, "ev")


def test_a_position_remember_returned_is_taken():
    assert _position({"topic": "ev", "partition": 2**31 - 1, "offset": 2**63 - 1}, "ev").partition == 2**31 - 1


def test_a_context_says_when_a_store_failed_or_a_write_is_not_in_it_yet():
    from memstream.mcp_server import _noted
    from memstream.schemas.read_models import MemoryContext

    ask = dict(user_id="acme:ana", conversation_id="c", message="hi")
    assert _noted(MemoryContext(**ask)) == ""
    assert _noted(MemoryContext(**ask, degraded=["facts", "episodes"], caught_up=False)) == (
        "[memory unavailable: facts, episodes]\n[memory may not hold what was just remembered yet]\n")
