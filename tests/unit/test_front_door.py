"""One front door: ``memstream.connect()`` owns the log and the reader; the surfaces (the HTTP
API, the MCP server, the CLI's control calls) use it and construct neither themselves."""
import ast
import inspect
from pathlib import Path

import pytest

import memstream
from memstream.cli import base as cli
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
            elif isinstance(f, ast.Attribute) and f.attr in OWNED:  # producer.TurnLog(...)
                found.add(f.attr)
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in OWNED:
                found.add(f"{f.value.id}.{f.attr}")
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr in OWNED:
                found.add(f"{f.value.attr}.{f.attr}")
    return found


@pytest.mark.parametrize("path", ["memstream/api/app.py", "memstream/mcp_server.py"])
def test_the_api_and_the_mcp_server_construct_neither_the_log_nor_the_reader(path):
    assert constructs(ast.parse((ROOT / path).read_text())) == set()


def test_the_clis_control_calls_construct_neither():
    assert constructs(ast.parse(inspect.getsource(cli.run_on_memory))) == set()


def test_the_check_finds_a_surface_that_does():
    source = ("async def f(s):\n    r = await MemoryReader.connect(s)\n    log = TurnLog(s)\n"
              "    log = producer.TurnLog(s)\n    r = await read_client.MemoryReader.connect(s)")
    assert constructs(ast.parse(source)) == {"MemoryReader.connect", "TurnLog"}


def test_the_readme_quick_start_is_at_most_15_lines_on_connect():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Using it from a host"):]
    lines = [line for line in section.split("```python\n", 1)[1].split("```", 1)[0].splitlines() if line.strip()]
    assert len(lines) <= 15 and "from memstream import connect" in lines, lines


def test_the_front_door_is_the_package_and_a_memory_is_used_inside_its_context():
    assert memstream.connect is connect and memstream.Memory is Memory
    memory = connect(memstream.Settings())
    with pytest.raises(RuntimeError, match="async with"):
        memory.log
    assert {"connect", "Memory"} <= set(dir(memstream))
    with pytest.raises(AttributeError):
        memstream.nothing_of_that_name


async def test_corrections_and_forgets_go_through_the_calls_that_check_whose_memory_it_is():
    from datetime import datetime, timezone

    from memstream.schemas import UserForgotten
    from memstream.schemas.errors import InvalidArgument
    from memstream.schemas.events import new_event_id

    memory = connect(memstream.Settings())
    forget = UserForgotten(event_id=new_event_id(), user_id="u", occurred_at=datetime.now(timezone.utc), actor="user")
    with pytest.raises(InvalidArgument, match="forget_user"):
        await memory.append(forget)
    turn = memstream.TurnRecorded.new(user_id="u", conversation_id="c", user_message="x", assistant_message="y")
    with pytest.raises(InvalidArgument, match="not both"):
        await memory.remember(turn, occurred_at=datetime.now(timezone.utc))


@pytest.mark.parametrize("old, new, name", [
    ("memstream.streams.producer", "memstream.streams.log.producer", "TurnLog"),
    ("memstream.streams.errors", "memstream.streams.log.errors", "BrokerUnavailable"),
    ("memstream.streams.sealing", "memstream.streams.log.sealing", "RecordSealer"),
    ("memstream.sealing", "memstream.keys", "DataKeys"),
    ("memstream.dead_letters", "memstream.streams.ops.dead_letters", "retry"),
])
def test_an_old_module_path_still_imports_and_says_where_it_went(old, new, name):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        moved = importlib.import_module(old)
    assert getattr(moved, name) is getattr(importlib.import_module(new), name)


def test_the_workers_old_names_are_looked_up_where_they_went():
    import memstream.streams.worker as worker
    from memstream.streams.worker.runtime import run_worker

    with pytest.warns(DeprecationWarning, match="memstream.streams.worker.runtime"):
        assert worker.run_worker is run_worker
