"""One front door: ``memstream.connect()`` owns the log and the reader; the surfaces (the HTTP
API, the MCP server, the CLI's control commands) use it and construct neither themselves."""
import ast
import inspect
from pathlib import Path

import pytest

import memstream
from memstream import cli
from memstream.memory import Memory, connect

ROOT = Path(__file__).resolve().parents[2]
OWNED = {"TurnLog", "MemoryReader"}


def constructs(tree: ast.AST) -> set[str]:
    """The names of ``OWNED`` called, or their ``connect``, in ``tree``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in OWNED:
                found.add(f.id)
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in OWNED:
                found.add(f"{f.value.id}.{f.attr}")
    return found


@pytest.mark.parametrize("path", ["memstream/api/app.py", "memstream/mcp_server.py"])
def test_the_api_and_the_mcp_server_construct_neither_the_log_nor_the_reader(path):
    assert constructs(ast.parse((ROOT / path).read_text())) == set()


def test_the_clis_control_commands_construct_neither():
    assert constructs(ast.parse(inspect.getsource(cli._control))) == set()


def test_the_check_finds_a_surface_that_does():
    assert constructs(ast.parse("async def f(s):\n    r = await MemoryReader.connect(s)\n    log = TurnLog(s)")) == {
        "MemoryReader.connect", "TurnLog"}


def test_the_front_door_is_the_package_and_a_memory_is_used_inside_its_context():
    assert memstream.connect is connect and memstream.Memory is Memory
    memory = connect(memstream.Settings())
    with pytest.raises(RuntimeError, match="async with"):
        memory.log
    with pytest.raises(AttributeError):
        memstream.nothing_of_that_name
