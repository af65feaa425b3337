"""Commands on one person's memory, for hosts and operators: list, history, correct, forget,
forget a whole user, export and import."""
from __future__ import annotations

from pathlib import Path

import click

from memstream.progress import progress
from memstream.schemas.events import ACTORS, ERASURE_REASONS
from memstream.cli.base import echo, log_settings, main, parse_uuid, run_on_memory, typed


@main.group()
def memories() -> None:
    """See, correct and forget what memstream holds about a user (requests on their log)."""


@memories.command("list")
@click.argument("user")
@click.option("--kind", type=click.Choice(["facts", "episodes", "edges", "refused", "archived"]), default="facts",
              show_default=True, help="refused: candidates the junk guard did not keep, and why; archived: facts a "
                                      "decay sweep took off the read path")
@click.option("--history", is_flag=True, help="every version of facts, closed edges too")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 500))
@click.option("--cursor", help="the next_cursor of the page before")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def memories_list(ctx, user: str, kind: str, history: bool, limit: int, cursor: str | None, as_json: bool) -> None:
    """One page of the user's facts, episodes, edges, refused candidates or archived facts, oldest first."""
    page = run_on_memory(ctx, lambda log, reader: reader.memories(user, kind, include_history=history, limit=limit,
                                                             cursor=cursor))
    def line(item) -> str:
        if kind in ("facts", "archived"):
            return f"{item.fact_id}  {item.status:<10} {item.text}"
        if kind == "refused":
            return f"{item.decision_id}  {item.refusal:<14} {item.text}  ({item.reason})"
        if kind == "episodes":
            return f"{item.episode_id}  {item.occurred_at:%Y-%m-%d %H:%M} {item.conversation_id}: {item.user_message}"
        return f"{item.edge_id}  {'current' if item.valid_to is None else 'closed':<8} {item.fact_sentence}"
    echo(page.model_dump(mode="json"), as_json,
          [line(i) for i in page.items] + ([f"next page: --cursor {page.next_cursor}"] if page.next_cursor else []))


@memories.command("history")
@click.argument("user")
@click.argument("fact_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def memories_history(ctx, user: str, fact_id: str, as_json: bool) -> None:
    """Every version of a fact: what was believed, when, and why it changed (and who changed it)."""
    fid = parse_uuid(fact_id, "fact")
    versions = run_on_memory(ctx, lambda log, reader: reader.fact_history(user, fid))
    if not versions:
        raise click.ClickException(f"no fact {fact_id} of user {user!r}")
    echo([v.model_dump(mode="json") for v in versions], as_json,
          [f"v{v.version} {v.status:<10} {v.text}  (recorded because: {v.reason}"
           + (f"; ended because: {v.end_reason})" if v.end_reason else ")") for v in versions])


@memories.command("correct")
@click.argument("user")
@click.argument("fact_id")
@click.argument("value")
@click.option("--text", help="the fact as a sentence (default: the old text with the new value)")
@click.option("--actor", type=click.Choice(ACTORS), default="operator", show_default=True)
@click.option("--reason", default="", help="why, for the history")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def memories_correct(ctx, user, fact_id, value, text, actor, reason, as_json) -> None:
    """Correct a fact: a new, explicit version (it passes the safety gate)."""
    from memstream.control import correct_fact

    fid = parse_uuid(fact_id, "fact")
    pos = run_on_memory(ctx, lambda log, reader: correct_fact(log, reader, user, fid, value, text=text, actor=actor,
                                                         reason=reason))
    echo({"appended": _position(pos)}, as_json,
          [f"correction appended at {_where(pos)}; the facts projection applies it in a moment"])


@memories.command("forget")
@click.argument("user")
@click.option("--fact", "fact_id", help="a fact id")
@click.option("--episode", "episode_id", help="an episode id")
@click.option("--edge", "edge_id", help="an edge id")
@click.option("--actor", type=click.Choice(ACTORS), default="operator", show_default=True)
@click.option("--reason", default="", help="why, for the history")
@click.option("--keep-episodes", is_flag=True, help="with --fact: keep the turns it was read from")
@click.option("--dry-run", is_flag=True, help="with --fact: list the turns that would go, append nothing")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def memories_forget(ctx, user, fact_id, episode_id, edge_id, actor, reason, keep_episodes, dry_run, as_json) -> None:
    """Forget one fact, episode or edge of the user. A fact takes the edges stating it and the
    turns it was read from (listed first) with it, unless --keep-episodes."""
    from memstream import control

    given = [(k, v) for k, v in (("fact", fact_id), ("episode", episode_id), ("edge", edge_id)) if v]
    if len(given) != 1:
        raise click.UsageError("name exactly one of --fact, --episode, --edge")
    kind, raw = given[0]
    if kind != "fact" and (keep_episodes or dry_run):
        raise click.UsageError("--keep-episodes and --dry-run go with --fact")
    target = parse_uuid(raw, kind)
    forget = {"fact": control.forget_fact, "episode": control.forget_episode, "edge": control.forget_edge}[kind]
    extra = {"keep_episodes": keep_episodes} if kind == "fact" else {}

    async def run(log, reader):
        going = [] if kind != "fact" or keep_episodes else await control.episodes_of_fact(reader, user, target)
        if dry_run:
            return None, going
        return await forget(log, reader, user, target, actor=actor, reason=reason, **extra), going

    pos, going = run_on_memory(ctx, run)
    lines = [f"{'would forget' if dry_run else 'forgets'} {len(going)} turn(s) the fact was read from:"] if going else []
    lines += [f"  {e.episode_id}  {e.occurred_at:%Y-%m-%d %H:%M}  {_shorten(e.user_message)}" for e in going]
    lines += [] if pos is None else [f"forget {kind} appended at {_where(pos)}"]
    echo({"appended": None if pos is None else _position(pos),
           "episodes": [str(e.episode_id) for e in going]}, as_json, lines)


def _shorten(text: str, n: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 1] + "…"


@main.command("forget-user")
@click.argument("user")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.option("--actor", type=click.Choice(ACTORS), default="operator", show_default=True)
@click.option("--reason", type=click.Choice(ERASURE_REASONS), default="unspecified", show_default=True,
              help="why, for the log (a kind, never text: the forget stays readable there)")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def forget_user(ctx, user, yes, actor, reason, as_json) -> None:
    """Forget everything of a user: every row and cache key, in every projection."""
    from memstream.control import forget_user as forget

    if not yes:
        click.confirm(f"Forget everything memstream holds about {user!r}? This cannot be undone", abort=True)
    pos = run_on_memory(ctx, lambda log, reader: forget(log, user, actor=actor, reason=reason))
    echo({"appended": _position(pos)}, as_json, [f"forget-user appended at {_where(pos)}"])


@main.command("export")
@click.argument("user")
@click.option("-o", "--output", "path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def export_cmd(ctx, user: str, path: Path, as_json: bool) -> None:
    """Write USER's log (events and decisions, opened) as a versioned JSONL archive."""
    from memstream.portability import export_user

    with progress("export") as on_progress:
        header = typed(export_user(log_settings(ctx), user, path, on_progress))
    echo(header, as_json, [f"{header['events']} events and {header['decisions']} decisions of {user!r} -> {path}"])


@main.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="import it even though the user was forgotten here after it was exported")
@click.option("--merge", is_flag=True, help="import it even though this deployment remembers the user already")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def import_cmd(ctx, path: Path, force: bool, merge: bool, as_json: bool) -> None:
    """Append an exported user's log to this deployment's topics (formation decides nothing again)."""
    from memstream.portability import import_user

    with progress("import") as on_progress:
        done = typed(import_user(log_settings(ctx), path, on_progress, force=force, merge=merge))
    echo(done, as_json, [f"imported {done['events']} events and {done['decisions']} decisions of {done['user_id']!r}"])


def _position(pos) -> dict:
    return {"topic": pos.topic, "partition": pos.partition, "offset": pos.offset}


def _where(pos) -> str:
    return f"{pos.topic}/{pos.partition}@{pos.offset}"
