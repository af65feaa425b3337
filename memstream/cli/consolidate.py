"""Commands for consolidation: the decay and reflection sweeps an operator runs (each formation
worker also runs them on its timer)."""
from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone

import click

from memstream.progress import progress
from memstream.cli.base import log_settings, main, resolve_dsn
from memstream.schemas.errors import InvalidArgument

_TIMES = click.DateTime(formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S"])
FUTURE_SLACK = timedelta(minutes=1)  # clocks of two hosts disagree by this much at most


def sweep_time(at: datetime | None, dry_run: bool) -> datetime | None:
    """``--as-of`` (UTC if no offset; None: now); a time to come only with ``--dry-run``: recorded
    on the log, a sweep dated years ahead would archive what is not weak yet and keep cooled
    episodes cold until then."""
    if at is not None and at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    if at is not None and at > datetime.now(timezone.utc) + FUTURE_SLACK and not dry_run:
        raise InvalidArgument(f"--as-of {at.isoformat()} is to come: only a --dry-run may look ahead")
    return at


@main.group("sweep")
def sweep_group() -> None:
    """Consolidation sweeps: decisions recorded on the users' logs, replayed, never run again."""


def _swept(ctx: click.Context, kind: str, run, user_id: str | None, dry_run: bool, at, as_json: bool):
    """Run one sweep with a progress bar; its report, or None once printed as JSON."""
    s = log_settings(ctx)
    at = sweep_time(at, dry_run)
    with progress(f"sweep {kind}", unit="users") as on_progress:
        found = asyncio.run(run(s, resolve_dsn(s), user_id=user_id, dry_run=dry_run, at=at,
                                on_progress=on_progress))
    report = found.as_dict()
    if as_json:
        click.echo(json.dumps(report))
        return None
    return found, report


@sweep_group.command("decay")
@click.option("--user", "user_id", help="this user only (default: everyone)")
@click.option("--dry-run", is_flag=True, help="list what would be archived and why; append nothing")
@click.option("--as-of", type=_TIMES, help="weigh as of this time (UTC if no offset) instead of now: what would go by then")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def sweep_decay(ctx: click.Context, user_id: str | None, dry_run: bool, as_of, as_json: bool) -> None:
    """Archive faded facts and cool old episodes: weigh every current fact now (decay policy,
    recall counts) and ask, on each user's log, for those below the threshold to leave the read
    path, and for episodes not said or used in a long time to leave the hot vector index."""
    from memstream.streams.ops.sweep import sweep_decay as run

    if (swept := _swept(ctx, "decay", run, user_id, dry_run, as_of, as_json)) is None:
        return
    found, report = swept
    verb, move = ("would archive", "would move") if dry_run else ("archiving", "moving")
    click.echo(f"sweep {report['sweep_id']} at {report['swept_at']} ({report['policy']}, below {found.threshold:g}): "
               f"{report['facts_weighed']} facts weighed, {verb} {report['archiving']}; {move} "
               f"{report['cooling_episodes']} episodes to the cold index and {report['warming_episodes']} back; "
               f"{report['users']} users")
    for f in report["facts"]:
        click.echo(f"  {f['user_id']}  {f['fact_id']}  strength {f['strength']:.2f}  idle {f['idle_days']:.0f} d  "
                   f"observed {f['observations']}x  used {f['uses']}x  {f['text']}")
    for e in report["episodes"]:
        click.echo(f"  {e['user_id']}  episodes: {e['cooling']} to the cold index (not said or used in "
                   f"{report['cold_after_days']:g} days), {e['warming']} back (used since)")


@sweep_group.command("reflect")
@click.option("--user", "user_id", help="this user only (default: everyone)")
@click.option("--dry-run", is_flag=True, help="list the clusters that would be asked about; append nothing")
@click.option("--as-of", type=_TIMES,
              help="cluster the facts said in the window before this time (UTC if no offset) instead of now")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def sweep_reflect(ctx: click.Context, user_id: str | None, dry_run: bool, as_of, as_json: bool) -> None:
    """Reflections (Tier 3): cluster each user's recent facts by meaning and ask, on their log,
    for one sentence on each cluster said often enough; formation asks the model and records it."""
    from memstream.streams.ops.sweep import sweep_reflect as run

    if (swept := _swept(ctx, "reflect", run, user_id, dry_run, as_of, as_json)) is None:
        return
    _, report = swept
    verb = "would ask about" if dry_run else "asking about"
    click.echo(f"sweep {report['sweep_id']} at {report['swept_at']} ({report['policy']}): {report['facts_read']} "
               f"facts and {report['turns_read']} turns read, {verb} {report['clusters']} clusters of "
               f"{report['users']} users")
    for c in report["asked"]:
        # A turn's words are listed by their start: a long message would hide the cluster.
        said = [f["text"] for f in c["sources"]] + [f'"{_start(t["text"])}"' for t in c["turns"]]
        click.echo(f"  {c['user_id']}  {len(c['sources'])} facts and {len(c['turns'])} turns said "
                   f"{c['observations']}x: " + "; ".join(said))


def _start(text: str, chars: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= chars else text[:chars - 3] + "..."
