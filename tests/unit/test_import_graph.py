"""The import graph, computed from the code: no cycles, and dependencies only in the directions
the architecture sets (docs/architecture.md) (``schemas`` imports nothing of ours; ``projections`` only ``schemas``; the read
client only ``schemas``, the query side of ``projections`` and the embedder's public interface;
nothing imports the CLI; only the CLI, the demo and the benchmarks start the local stack).
Every import counts, at module level or inside a function: a lazy import is still a dependency."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("memstream.cli", "memstream.demo", "memstream.bench")  # entry points: may use anything but the CLI
# layer -> the layers it may import (besides itself)
ALLOWED = {
    "memstream.schemas": (),
    "memstream.read_settings": (),
    "memstream.embedding": (),
    "memstream.projections": ("memstream.schemas",),
    "memstream.llm": ("memstream.schemas",),
    "memstream.config": ("memstream.read_settings", "memstream.projections.schema_names"),
    "memstream.stack": ("memstream.config", "memstream.schemas"),
    "memstream.keys": ("memstream.schemas", "memstream.projections"),
    # The streams by who runs them: the log (hosts, workers and operators), the running worker, and
    # what an operator runs once. Each floor may use the ones below it, never one above.
    "memstream.streams.log": ("memstream.schemas", "memstream.projections", "memstream.config", "memstream.keys"),
    "memstream.streams.worker": ("memstream.schemas", "memstream.projections", "memstream.config", "memstream.keys",
                                 "memstream.llm", "memstream.embedding", "memstream.streams.log"),
    "memstream.streams.ops": ("memstream.schemas", "memstream.projections", "memstream.config", "memstream.keys",
                              "memstream.llm", "memstream.embedding", "memstream.streams.log", "memstream.streams.worker"),
    # The front door and the surfaces on it append to the log and read; they run no worker.
    "memstream.memory": ("memstream.schemas", "memstream.config", "memstream.control", "memstream.portability",
                         "memstream.read_client", "memstream.streams.log"),
    "memstream.mcp_server": ("memstream.schemas", "memstream.config", "memstream.control", "memstream.memory",
                             "memstream.read_client", "memstream.api", "memstream.streams.log"),
    "memstream.api": ("memstream.schemas", "memstream.config", "memstream.control", "memstream.memory",
                      "memstream.portability", "memstream.projections", "memstream.read_client",
                      "memstream.streams.log", "memstream.streams.ops"),
    "memstream.control": ("memstream.schemas",),
    "memstream.portability": ("memstream.schemas", "memstream.projections", "memstream.read_client",
                              "memstream.streams.log"),
    "memstream.progress": (),
    # The package's own ``__init__`` (``connect`` and friends, looked up lazily) and the old
    # paths kept for one release: each may reach only where its names went.
    "memstream": ("memstream.memory", "memstream.config", "memstream.schemas"),
    "memstream.streams": ("memstream.streams.log",),
    "memstream.sealing": ("memstream.keys",),
    "memstream.dead_letters": ("memstream.streams.ops",),
    "memstream.read_client": ("memstream.schemas", "memstream.read_settings", "memstream.projections",
                              "memstream.embedding"),
}
# The read client reads: it may not reach the write side of projections, nor into the embedder.
READ_SIDE = ("memstream.projections.db", "memstream.projections.positions", "memstream.projections.session_cache")
NO_IO_IN_CORES = ("asyncpg", "redis", "aiokafka", "faust", "boto3", "socket", "time", "random", "numpy")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the distribution, named as installed (pyproject's ``package-dir``)."""
    dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found: dict[str, Path] = {}
    for package, folder in dirs.items():
        for path in (root / folder).rglob("*.py"):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.setdefault(".".join([package, *parts]), path)
    return found


def imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(ours, third_party)``: per module, the modules of ours it imports and the top-level
    names of the others. ``from pkg import sub`` imports ``pkg.sub`` and ``pkg`` itself (its
    ``__init__`` runs first: a submodule importing its own package that way is a cycle)."""
    ours: dict[str, set[str]] = {m: set() for m in mods}
    others: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
            else:
                continue
            for t in targets:
                if t.split(".")[0] == "memstream":
                    ours[name].add(next(m for m in (t, t.rpartition(".")[0]) if m in mods))
                else:
                    others[name].add(t.split(".")[0])
        ours[name].discard(name)
    return ours, others


def layer(module: str) -> str:
    """The layer a module belongs to: the longest prefix named in ``ALLOWED`` or ``TOOLS`` (the
    package ``memstream`` names only its own ``__init__``); itself if none."""
    return max((p for p in (*ALLOWED, *TOOLS) if module == p or (p != "memstream" and module.startswith(p + "."))),
               key=len, default=module)


def reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for t in graph.get(todo.pop(), ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def wrong_way(ours: dict[str, set[str]], others: dict[str, set[str]]) -> list[str]:
    found = []
    for m, targets in sorted(ours.items()):
        for t in sorted(targets):
            if t == "memstream.cli" and layer(m) != "memstream.cli":
                found.append(f"{m} -> {t}: nothing imports the CLI")
            elif t.startswith("memstream.stack") and layer(m) not in TOOLS + ("memstream.stack",):
                found.append(f"{m} -> {t}: only the CLI, the demo and the benchmarks start the local stack")
            elif layer(m) in ALLOWED and layer(t) != layer(m) and not any(
                    t == a or (a != "memstream" and t.startswith(a + ".")) for a in ALLOWED[layer(m)]):
                found.append(f"{m} -> {t}: {layer(m)} may import only {ALLOWED[layer(m)] or 'nothing of ours'}")
            elif layer(m) == "memstream.read_client" and t.startswith("memstream.projections.") and not (
                    t.endswith(".query") or t in READ_SIDE or t.count(".") == 2):
                found.append(f"{m} -> {t}: the read client uses only the query side of projections")
            elif layer(m) == "memstream.read_client" and t.startswith("memstream.embedding."):
                found.append(f"{m} -> {t}: the read client uses only the embedder's public interface")
    for m, names in sorted(others.items()):
        if layer(m) == "memstream.read_client" and names & {"faust", "aiokafka", "mode"}:
            found.append(f"{m} imports {sorted(names & {'faust', 'aiokafka', 'mode'})}: a host that only reads pulls no stream processor")
        if m.endswith(".core") and m.startswith("memstream.projections") and names & set(NO_IO_IN_CORES):
            found.append(f"{m} imports {sorted(names & set(NO_IO_IN_CORES))}: a pure core has no I/O, clock or randomness")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            component.append(v)
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_cycle():
    ours, _ = imports(modules())
    assert cycles(ours) == []


def test_every_import_points_the_way_the_design_says():
    assert wrong_way(*imports(modules())) == []


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer(m) not in ALLOWED and layer(m) not in TOOLS] == []


def test_the_front_door_and_its_surfaces_reach_no_worker_even_through_others():
    """What a host runs (``connect``, the HTTP API, the MCP server, the read client) pulls in no
    worker, directly or through anything it imports."""
    ours, _ = imports(modules())
    hosts = [m for m in ours if layer(m) in ("memstream", "memstream.memory", "memstream.api", "memstream.mcp_server",
                                              "memstream.read_client")]
    assert {m: sorted(t for t in reaches(ours, m) if t.startswith("memstream.streams.worker")) for m in hosts} == {
        m: [] for m in hosts}


def test_the_transitive_check_sees_a_worker_behind_another_module():
    graph = {"memstream.memory": {"memstream.portability"}, "memstream.portability": {"memstream.streams.worker.runtime"}}
    assert "memstream.streams.worker.runtime" in reaches(graph, "memstream.memory")


def test_the_checks_see_a_wrong_way_import_between_the_floors_of_the_streams():
    assert wrong_way({"memstream.streams.log.producer": {"memstream.streams.worker.runtime"},
                      "memstream.streams.worker.ingress": {"memstream.streams.ops.status"},
                      "memstream.memory": {"memstream.streams.worker.runtime"},
                      "memstream.streams.ops.replay": {"memstream.streams.worker.projecting", "memstream.streams.log.topics"}},
                     {}) == [
        "memstream.memory -> memstream.streams.worker.runtime: memstream.memory may import only "
        "('memstream.schemas', 'memstream.config', 'memstream.control', 'memstream.portability', "
        "'memstream.read_client', 'memstream.streams.log')",
        "memstream.streams.log.producer -> memstream.streams.worker.runtime: memstream.streams.log may import only "
        "('memstream.schemas', 'memstream.projections', 'memstream.config', 'memstream.keys')",
        "memstream.streams.worker.ingress -> memstream.streams.ops.status: memstream.streams.worker may import only "
        "('memstream.schemas', 'memstream.projections', 'memstream.config', 'memstream.keys', 'memstream.llm', "
        "'memstream.embedding', 'memstream.streams.log')"]


def test_the_checks_see_a_cycle_and_a_wrong_way_import():
    graph = {"memstream.schemas.a": {"memstream.schemas.b"}, "memstream.schemas.b": {"memstream.schemas.a"}}
    assert cycles(graph) == [["memstream.schemas.a", "memstream.schemas.b"]]
    assert wrong_way({"memstream.read_client.reader": {"memstream.streams.worker.runtime", "memstream.projections.facts.store"},
                      "memstream.schemas.events": {"memstream.cli"}}, {}) == [
        "memstream.read_client.reader -> memstream.projections.facts.store: the read client uses only the query side of projections",
        "memstream.read_client.reader -> memstream.streams.worker.runtime: memstream.read_client may import only "
        "('memstream.schemas', 'memstream.read_settings', 'memstream.projections', 'memstream.embedding')",
        "memstream.schemas.events -> memstream.cli: nothing imports the CLI"]


def test_no_source_file_holds_several_jobs_by_its_length():
    """One job per file: none over 500 lines but the event catalogue (one class per event type)."""
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > 500 and name != "memstream.schemas.events"}
    assert long == {}
