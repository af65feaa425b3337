"""The docs hold: every fenced code block of README.md and docs/*.md (but the benchmark history)
is checked, README stays a door, links resolve, and no page names the project's issue numbers.

Pure checks only: commands are parsed with the CLI's own click parser (nothing runs but `--help`
and `jsonschema --check`), `make` lines name Makefile targets, JSON and YAML parse, Python
compiles. tests/integration/test_docs.py runs the Python blocks, and the read-only commands that
need the stack, against the local stack."""
from __future__ import annotations

import enum
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
HISTORY = ROOT / "docs" / "benchmarks-history.md"
# Pages whose code blocks are checked and run: README and docs/, but not the benchmark history,
# a dated record kept as it was written (its commands are those of their day).
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p != HISTORY)]
# Pages that must not name our issues: the user-facing ones.
USER_FACING = [*PAGES, ROOT / "BENCHMARKS.md"]
# Pages whose relative links must resolve: every page a reader can land on.
LINKED = [*USER_FACING, HISTORY]

SHELL = {"sh", "bash", "console"}
CHECKED = {"python", "json", "yaml", "yml"} | SHELL
# Other languages are allowed only here, each with why nothing checks them.
OTHER_LANGUAGES = {
    "text": "diagrams and sample output: nothing to parse or run",
}
# Programs a shell block may run besides `memstream` and `make`, each with why it is only listed.
OTHER_PROGRAMS = {
    "docker": "production runs on docker compose, and the development machines have no Docker engine",
    ".venv/bin/python": "pytest and this repository's scripts, run by the test suite itself",
}
MEMSTREAM = {"memstream", ".venv/bin/memstream"}
# Commands cheap and harmless enough to run for real here (no stack, nothing written).
RUN_HERE = [("jsonschema",)]
# Read-only commands that need the stack: tests/integration/test_docs.py runs them for real.
RUN_ON_STACK = [("status",), ("stack", "status"), ("dead-letters", "list")]
NEVER_RUN_WITH = {"--watch"}  # runs until interrupted


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Command:
    block: Block
    line: int
    argv: tuple[str, ...]  # the program first, environment assignments left out

    @property
    def id(self) -> str:
        return f"{self.block.page.relative_to(ROOT)}:{self.line}"


def code_blocks(page: Path) -> list[Block]:
    """Every fenced (```) block of ``page``, with the language its fence names ("" if none)."""
    blocks, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)(`{3,})\s*([\w+-]*)", lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks, lang = fence.groups()
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(ticks):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        assert i < len(lines), f"{page.relative_to(ROOT)}:{start + 1}: a code block is never closed"
        blocks.append(Block(page, start + 1, lang.lower(), "\n".join(body) + "\n"))
        i += 1
    return blocks


def all_blocks() -> list[Block]:
    return [b for page in PAGES for b in code_blocks(page)]


def shell_commands(block: Block) -> list[Command]:
    """The commands of a shell block: continuations joined, comments dropped, each part of a
    ``&&``, ``||``, ``;`` or ``|`` chain on its own; in a ``console`` block only ``$ `` lines."""
    commands = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        first = i
        line = lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i]
        i += 1
        if block.lang == "console":
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        part: list[str] = []
        for token in [*lexer, ";"]:
            if token in {"&&", "||", ";", "|", "&"}:
                while part and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", part[0]):
                    part.pop(0)  # VAR=value before the program
                if part:
                    commands.append(Command(block, block.line + 1 + first, tuple(part)))
                part = []
            else:
                part.append(token)
    return commands


def all_commands() -> list[Command]:
    return [c for b in all_blocks() if b.lang in SHELL for c in shell_commands(b)]


def makefile_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9_.$()/-]+(?:\s+[A-Za-z0-9_.$()/-]+)*)\s*:(?!=)", line):
            targets.update(t for t in m.group(1).split() if not t.startswith((".", "$")))
    return targets


def parse_memstream(args: list[str]) -> tuple[str, ...]:
    """Parse ``memstream ARGS`` exactly as the CLI would, without running anything; return the
    command path (``("memories", "forget")``). Walks into subcommands with click's own
    ``make_context(..., resilient_parsing=True)`` (no callbacks, no prompts, ``--help`` does not
    exit), then, since resilient parsing forgives everything, checks strictly what it forgives:
    an unknown command or option, an option without its value, a value its type refuses, an
    extra or a missing argument."""
    from memstream.cli import main

    cmd: click.Command = main
    path: list[str] = []
    parent = None
    args = list(args)
    while True:
        name = " ".join(["memstream", *path])
        ctx = cmd.make_context(name, list(args), parent=parent, resilient_parsing=True)
        strict = click.Context(cmd, info_name=name, parent=parent)
        opts, rest, _ = cmd.make_parser(strict).parse_args(list(args))  # NoSuchOption, BadOptionUsage
        params = {p.name: p for p in cmd.get_params(strict)}
        opts = {k: v for k, v in opts.items() if given(v)}
        for key, value in opts.items():
            p = params.get(key)
            if p is None or isinstance(p.type, (click.File, click.Path)):
                continue  # a File would be opened, a Path looked for: only their syntax is checked
            p.type_cast_value(strict, value)  # BadParameter: a choice, a number, a date it refuses
        helping = bool(opts.get("help"))
        if isinstance(cmd, click.Group):
            if helping or not rest:
                return tuple(path)
            sub = cmd.get_command(ctx, rest[0])
            if sub is None:
                raise click.UsageError(f"no command {rest[0]!r} in `{name}`")
            path.append(rest[0])
            cmd, parent, args = sub, ctx, rest[1:]
            continue
        if rest:
            raise click.UsageError(f"`{name}` takes no more arguments: {rest}")
        if not helping:
            missing = [p.human_readable_name for p in params.values()
                       if p.required and opts.get(p.name) is None]
            if missing:
                raise click.UsageError(f"`{name}` is missing {', '.join(missing)}")
        return tuple(path)


def given(value) -> bool:
    """Whether the parser saw a value (click marks a parameter it did not see with a sentinel)."""
    return value is not None and not (isinstance(value, enum.Enum) and value.name == "UNSET")


def runs_on_stack(command: Command) -> bool:
    """Read-only commands that need the stack: the integration test runs them for real."""
    if command.argv[0] not in MEMSTREAM or NEVER_RUN_WITH & set(command.argv) or "--help" in command.argv:
        return False
    return parse_memstream(list(command.argv[1:])) in RUN_ON_STACK


def python_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.lang == "python"]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)  # no headings in code
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*$", text, flags=re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        found.add(s if n == 0 else f"{s}-{n}")
    return found


def links(page: Path) -> list[tuple[int, str]]:
    text = page.read_text()
    out = []
    for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1)))
    return out


# ------------------------------------------------------------------------------------------ tests

@pytest.mark.parametrize("block", all_blocks(), ids=lambda b: b.id)
def test_every_code_block_names_a_language_that_is_checked_or_listed(block):
    assert block.lang in CHECKED or block.lang in OTHER_LANGUAGES, (
        f"{block.id}: a ```{block.lang or '(no language)'} block: use one that is checked "
        f"({', '.join(sorted(CHECKED))}) or add it, with a reason, to OTHER_LANGUAGES")


@pytest.mark.parametrize("command", all_commands(), ids=lambda c: c.id)
def test_every_shell_command_is_memstream_make_or_listed_and_parses(command):
    program, args = command.argv[0], list(command.argv[1:])
    if program in MEMSTREAM:
        try:
            parse_memstream(args)
        except click.ClickException as e:
            pytest.fail(f"{command.id}: `{shlex.join(command.argv)}`: {e.format_message()}")
    elif program == "make":
        wanted = [a for a in args if not a.startswith("-") and "=" not in a]
        assert wanted, f"{command.id}: a bare `make`: name the target"
        assert set(wanted) <= makefile_targets(), f"{command.id}: no Makefile target {set(wanted) - makefile_targets()}"
    else:
        assert program in OTHER_PROGRAMS, (
            f"{command.id}: `{program}` is neither memstream nor make: make it one, or list it in "
            f"OTHER_PROGRAMS with why it is not checked")


def cheap_commands() -> list[Command]:
    return [c for c in all_commands() if c.argv[0] in MEMSTREAM and not NEVER_RUN_WITH & set(c.argv)
            and ("--help" in c.argv or parse_memstream(list(c.argv[1:])) in RUN_HERE)]


@pytest.mark.parametrize("command", cheap_commands(), ids=lambda c: c.id)
def test_cheap_read_only_commands_run_for_real(command):
    from memstream.cli import main

    done = CliRunner().invoke(main, list(command.argv[1:]), prog_name="memstream")
    assert done.exit_code == 0, f"{command.id}: `{shlex.join(command.argv)}` exited {done.exit_code}:\n{done.output}"


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.lang in {"json", "yaml", "yml"}], ids=lambda b: b.id)
def test_json_and_yaml_blocks_parse(block):
    if block.lang == "json":
        record = json.loads(block.text)
        if isinstance(record, dict) and "schema_version" in record:  # a record of the wire format
            from memstream.schemas.codec import decode_event

            decode_event(block.text.encode())
    else:
        yaml.safe_load(block.text)


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: b.id)
def test_python_blocks_compile(block):
    """The integration test runs them; a block that cannot even compile fails here first."""
    compile(block.text, block.id, "exec")


def test_the_checks_find_what_is_wrong():
    page = ROOT / "README.md"
    block = Block(page, 1, "bash", "FOO=1 memstream status --max-lag 3 && make demo  # comment\n"
                                    "memstream memories forget user-42 \\\n  --fact 1 --dry-run\n")
    assert [c.argv for c in shell_commands(block)] == [
        ("memstream", "status", "--max-lag", "3"), ("make", "demo"),
        ("memstream", "memories", "forget", "user-42", "--fact", "1", "--dry-run")]
    assert parse_memstream(["memories", "forget", "u", "--fact", "1"]) == ("memories", "forget")
    assert parse_memstream(["--help"]) == ()
    assert parse_memstream(["replay", "--help"]) == ("replay",)
    for wrong in (["no-such-command"], ["status", "--no-such-option"], ["status", "--max-lag"],
                  ["status", "--max-lag", "many"], ["worker", "--role", "neither"], ["switch"],
                  ["switch", "a", "b"], ["memories", "nothing"], ["reform", "--extractor", "offline", "--since", "May"]):
        with pytest.raises(click.ClickException):
            parse_memstream(wrong)
    assert {"demo", "test", "stack-down"} <= makefile_targets()
    assert slug("Using it from a host") == "using-it-from-a-host"
    assert slug("Accuracy: `memstream eval run`") == "accuracy-memstream-eval-run"
    assert ISSUE.search("since issue 41") and ISSUE.search("(#12)") and ISSUE.search("issues 16–18")
    assert not ISSUE.search("[link](#the-key-store) &#8212; 0.3 issues of the log")


def test_readme_is_a_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    commands = [c.argv for b in code_blocks(ROOT / "README.md") if b.lang in SHELL for c in shell_commands(b)]
    assert ("make", "demo") in commands and ("make", "test") in commands
    assert "### Using it from a host" in readme and "](docs/inspector.png)" in readme
    for needed in ("memstream serve", "/inspector", "memstream mcp", "## Guarantees"):
        assert needed in readme, needed
    linked = {target.split("#")[0] for _, target in links(ROOT / "README.md")}
    for page in PAGES[1:]:
        assert str(page.relative_to(ROOT)) in linked, f"README does not link {page.relative_to(ROOT)}"


@pytest.mark.parametrize("page", [p for p in LINKED if p.parent.name == "docs"], ids=lambda p: p.name)
def test_every_docs_page_opens_saying_who_it_is_for(page):
    lines = [line for line in page.read_text().splitlines() if line.strip()]
    assert lines[0].startswith("# ") and lines[1].startswith("For "), f"{page.name}: {lines[1]!r}"


ISSUE = re.compile(r"\b[Ii]ssues?\s+#?\d+|(?<![\w&/#])#\d+\b|\bPRs?\s*#?\d+")


@pytest.mark.parametrize("page", USER_FACING, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers_in_user_facing_pages(page):
    found = [f"{page.relative_to(ROOT)}:{n}: {line.strip()}" for n, line in enumerate(page.read_text().splitlines(), 1)
             if ISSUE.search(line)]
    assert not found, "\n".join(found)


def broken_links(page: Path) -> list[str]:
    broken = []
    for line, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        where = f"{page.name}:{line}: {target}"
        if not file.exists():
            broken.append(f"{where}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{where}: no heading #{anchor} in {file.name}")
    return broken


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = broken_links(page)
    assert not broken, "\n".join(broken)


def test_the_link_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## The `key` store\n\n[ok](#the-key-store) [ok](page.md#the-key-store) "
                    "[web](https://example.org/x) [gone](nope.md) [no](#nothing) ![img](missing.png)\n")
    assert [b.split(": ", 2)[-1] for b in broken_links(page)] == [
        "no such file", "no heading #nothing in page.md", "no such file"]


def test_every_setting_is_documented():
    """docs/configuration.md names every field of ``Settings`` as its variable, spelled in full or
    as the table's shorthand (`MEMSTREAM_EVENTS_TOPIC` / `_DECISIONS_TOPIC`)."""
    import memstream

    text = (ROOT / "docs" / "configuration.md").read_text()
    full = set(re.findall(r"`MEMSTREAM_([A-Z0-9_]+)`", text))
    short = set(re.findall(r"`_([A-Z0-9_]+)`", text))

    def documented(field: str) -> bool:
        name = field.upper()
        if name in full:
            return True
        return any(name.endswith("_" + s) and any(f.startswith(name[:-len(s)]) for f in full) or name == s
                   for s in short)

    missing = [f for f in memstream.Settings.model_fields if not documented(f)]
    assert not missing, f"docs/configuration.md does not document {missing}"
