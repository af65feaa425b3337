"""Commands for operators: migrations, the worker, replays, rebuilds and switches, partition growth,
reforms, status, the HTTP and MCP servers, keys, API keys and dead letters."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from pathlib import Path

import click

from memstream.config import Settings
from memstream.progress import progress
from memstream.cli.base import echo, log_settings, main, resolve_dsn, schema_name, settings_of, typed


@main.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create the schema and the key store and apply pending migrations (safe to re-run)."""
    from memstream.projections.db import migrate as run

    s = settings_of(ctx)
    dsn = resolve_dsn(s)
    from memstream.embedding import dimensions_of

    applied = asyncio.run(run(dsn, s.postgres_schema, dimensions_of(s)))
    asyncio.run(_key_store(s, dsn))
    click.echo(f"schema {s.postgres_schema}: " + (", ".join(applied) if applied else "up to date")
               + f"; key store {s.keys_schema}: ready")


async def _key_store(s: Settings, dsn: str) -> None:
    from memstream.projections.db import create_pool
    from memstream.keys import data_keys

    pool = await create_pool(dsn, s.postgres_schema, min_size=0, max_size=1)
    try:
        await data_keys(s, pool)
    finally:
        await pool.close()


@main.command()
@click.option("--role", type=click.Choice(["all", "formation", "projections"]), default="all", show_default=True,
              help="formation: events -> decisions; projections: decisions -> stores; all: both, as two processes")
@click.option("--loglevel", default="INFO")
@click.option("--no-prepare", is_flag=True, help="skip topic creation and migrations")
@click.option("--metrics-port", type=click.IntRange(1, 65534), metavar="PORT",
              help="serve Prometheus metrics: formation on PORT, projections on PORT+1 ($MEMSTREAM_METRICS_PORT)")
@click.pass_context
def worker(ctx: click.Context, role: str, loglevel: str, no_prepare: bool, metrics_port: int | None) -> None:
    """Run a worker (formation and/or projections) until SIGTERM."""
    import os

    from memstream.projections.db import migrate as run_migrations
    from memstream.streams.log.topics import ensure_topics

    if metrics_port is not None:
        os.environ["MEMSTREAM_METRICS_PORT"] = str(metrics_port)  # the roles' child processes read it too
        ctx.obj["settings"] = settings_of(ctx).model_copy(update={"metrics_port": metrics_port})
    s = log_settings(ctx)
    dsn = resolve_dsn(s)

    async def prepare() -> None:
        await ensure_topics(s)
        from memstream.embedding import dimensions_of

        await run_migrations(dsn, s.postgres_schema, dimensions_of(s))

    if not no_prepare:
        asyncio.run(prepare())
    if role == "all":
        from memstream.streams.worker.supervisor import supervise

        extra = ["--schema", s.postgres_schema]
        ctx.exit(supervise(("formation", "projections"), extra))
    from memstream.streams.worker.runtime import run_worker

    run_worker(s, dsn, role, loglevel=loglevel)


@main.command()
@click.argument("projections", nargs=-1, required=True)
@click.option("--into", "into", required=True, callback=lambda c, p, v: schema_name(v),
              help="target schema (created; must not hold these projections)")
@click.option("--from-topic", "topic", help="decisions topic to replay (default: the live one)")
@click.option("--bulk", is_flag=True, help="episodes: load first, index after (streams.ops.rebuild; much faster)")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def replay(ctx: click.Context, projections: tuple[str, ...], into: str, topic: str | None, bulk: bool,
           as_json: bool) -> None:
    """Replay PROJECTIONS (episodes, facts, graph, commands, or all) from offset 0 into SCHEMA, up
    to the high-water marks seen at start. Never calls an LLM or the embedder."""
    from memstream.streams.ops.rebuild import rebuild_episodes
    from memstream.streams.ops.replay import PROJECTIONS, replay

    names = list(PROJECTIONS) if projections == ("all",) else list(projections)
    if unknown := [n for n in names if n not in PROJECTIONS]:  # before a bulk rebuild runs for nothing
        raise click.BadParameter(f"{', '.join(unknown)}: the projections are {', '.join(PROJECTIONS)} (or all)",
                                 param_hint="PROJECTIONS")
    s = log_settings(ctx)
    reports = []
    if bulk and "episodes" in names:
        names.remove("episodes")
        with progress("rebuild episodes") as on_progress:
            reports.append(asyncio.run(rebuild_episodes(s, resolve_dsn(s), into, topic=topic, on_progress=on_progress)))
    if names:
        with progress("replay") as on_progress:
            reports.append(asyncio.run(replay(s, resolve_dsn(s), into, names, topic=topic, on_progress=on_progress)))
    for report in reports:
        click.echo(json.dumps(report.as_dict()) if as_json else report.render())


@main.command()
@click.argument("schema", callback=lambda c, p, v: schema_name(v))
@click.option("--drop-old", is_flag=True, help="drop the schema that was live (default: kept as <live>_old_<n>)")
@click.option("--force", is_flag=True, help="switch even if the rebuilt schema's rows differ from the live one's")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def switch(ctx: click.Context, schema: str, drop_old: bool, force: bool, as_json: bool) -> None:
    """Make SCHEMA (rebuilt with `memstream replay all --into SCHEMA`) the live schema, atomically.

    Readers keep serving through it; running workers pause (they restart and wait) and go on on
    SCHEMA. SCHEMA is caught up with the log, compared with the live schema, then swapped in by
    name in one transaction."""
    from memstream.streams.ops.switch import SwitchRefused, switch as run

    s = log_settings(ctx)
    try:
        done = asyncio.run(run(s, resolve_dsn(s), schema, drop_old=drop_old, force=force))
    except SwitchRefused as exc:
        raise click.ClickException(str(exc)) from None
    echo(done, as_json, [f"{done['live']} is now what {done['from']} was; the old one "
                          + (f"kept as {done['old']}" if done["old"] else "dropped")
                          + f" ({done['caught_up_records']} records caught up; workers paused "
                          f"{done['workers_paused_s']:.1f} s)"])


@main.command()
@click.option("--into", callback=lambda c, p, v: schema_name(v), help="the schema to build (default: <live schema>_rebuild)")
@click.option("--drop-old", is_flag=True, help="drop the schema that was live once switched")
@click.option("--force", is_flag=True, help="switch even if the rebuilt rows differ from the live ones")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def rebuild(ctx: click.Context, into: str | None, drop_old: bool, force: bool, as_json: bool) -> None:
    """Blue-green: rebuild every projection from the log into a fresh schema while the live one
    serves (`replay all --bulk`), then switch to it (`switch`: running workers pause for it)."""
    from memstream.streams.ops.rebuild import rebuild_episodes
    from memstream.streams.ops.switch import SwitchRefused, switch as run
    from memstream.streams.ops.replay import PROJECTIONS, replay

    s = log_settings(ctx)
    dsn = resolve_dsn(s)
    into = into or schema_name(f"{s.postgres_schema}_rebuild")
    with progress("rebuild episodes") as on_progress:
        asyncio.run(rebuild_episodes(s, dsn, into, on_progress=on_progress))
    with progress("replay") as on_progress:
        asyncio.run(replay(s, dsn, into, [p for p in PROJECTIONS if p != "episodes"], on_progress=on_progress))
    try:
        done = asyncio.run(run(s, dsn, into, drop_old=drop_old, force=force))
    except SwitchRefused as exc:
        raise click.ClickException(f"built {into}, not switched: {exc}. Then: memstream switch {into} [--force]") from None
    echo(done, as_json, [f"rebuilt into {into}, now live as {done['live']}; the old one "
                          + (f"kept as {done['old']}" if done["old"] else "dropped")])


@main.group()
def partitions() -> None:
    """The log's partition count."""


@partitions.command("grow")
@click.option("--to", "to", required=True, type=click.IntRange(min=2), help="the new count: a multiple of today's")
@click.option("--drain-timeout", default=300.0, show_default=True, type=click.FloatRange(min=1), metavar="SECONDS",
              help="how long to wait for the workers to finish the old topics once they are fenced")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def partitions_grow(ctx: click.Context, to: int, drain_timeout: float, as_json: bool) -> None:
    """Move the log to new topics of TO partitions, keeping every user's records in order.

    Copies the log while everything runs, then fences the old topics (appends wait), lets the
    running workers finish them, and cuts over; the workers restart on the new topics by
    themselves. Interrupted, run it again: it resumes."""
    from memstream.schemas.errors import InvalidArgument
    from memstream.streams.ops.partition_growth import GrowthError, grow_partitions

    s = settings_of(ctx)
    try:
        with progress("copy") as on_progress:
            report = asyncio.run(grow_partitions(s, resolve_dsn(s), to, on_progress=on_progress,
                                                 drain_timeout_s=drain_timeout))
    except (GrowthError, InvalidArgument) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(report.as_dict()) if as_json else report.render())


@main.command()
@click.option("--extractor", required=True, type=click.Choice(["offline", "offline-strict", "bedrock"]))
@click.option("--since", type=click.DateTime(formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S"]),
              help="re-form events from this time on (UTC if no offset); earlier decisions are copied")
@click.option("--into-topic", "topic", help="decisions topic of the new version (default: <decisions>.reform-<extractor>)")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def reform(ctx: click.Context, extractor: str, since, topic: str | None, as_json: bool) -> None:
    """Re-run formation over the events log with EXTRACTOR into a separate decisions version."""
    from datetime import timezone

    from memstream.streams.ops.reform import reform as run

    s = log_settings(ctx)
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=timezone.utc)
    with progress("reform", unit="events") as on_progress:
        report = asyncio.run(run(s, extractor=extractor, topic=topic or f"{s.decisions_topic}.reform-{extractor}",
                                 since=since, on_progress=on_progress))
    click.echo(json.dumps(report.as_dict()) if as_json else report.render())


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--watch", type=click.FloatRange(min=0.5), metavar="SECONDS", help="print again every SECONDS until interrupted")
@click.option("--max-lag", type=click.IntRange(min=0), metavar="N",
              help="exit 2 when any step lags more than N records (a health check; with --watch, "
                   "at the first report that does)")
@click.pass_context
def status(ctx: click.Context, as_json: bool, watch: float | None, max_lag: int | None) -> None:
    """Positions and lag (records, seconds) of every step per partition, dead letters, worker groups."""
    import time

    from memstream.streams.ops.status import pipeline_status

    s = log_settings(ctx)
    dsn = resolve_dsn(s)
    while True:
        report = asyncio.run(pipeline_status(s, dsn))
        click.echo(json.dumps(report.as_dict()) if as_json else "\n".join(report.lines()))
        if max_lag is not None and report.max_lag > max_lag:
            ctx.exit(2)  # with --watch too: a watching monitor learns of it at the first report that lags
        if watch is None:
            break
        time.sleep(watch)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="loopback by default: put a TLS proxy in front")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.option("--demo", is_flag=True, help="serve `memstream demo`'s users, printing a sign-in link to the inspector")
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, demo: bool) -> None:
    """Serve the HTTP API (OpenAPI at /docs) and the memory inspector (/inspector) until
    interrupted. Keys: `memstream api-keys create`."""
    try:
        import uvicorn

        from memstream.api.app import RedactedAccessLog, create_app
        from memstream.api.keys import ApiKeys
    except ImportError as exc:
        raise click.ClickException(f"the HTTP API needs the 'api' extra: pip install 'memstream[api]' ({exc})") from None
    s = settings_of(ctx)
    keys = ApiKeys(Path(s.home) / "api-keys.json")
    if demo:
        from memstream.demo import demo_settings

        if host not in ("127.0.0.1", "localhost", "::1"):
            raise click.UsageError("--demo prints an operator key in a link: serve it on loopback only")

        s = demo_settings(s)
        # An operator key of this process only: the link signs in until the server stops.
        link = f"http://{host}:{port}/inspector#key={keys.session_key('demo inspector')}&user=maria"
        click.secho(f"memory inspector for the demo's users: {link}", bold=True)
    logging.getLogger("uvicorn.access").addFilter(RedactedAccessLog())
    uvicorn.run(create_app(s, keys=keys, dsn=resolve_dsn(s)), host=host, port=port, log_level="info")


@main.command("mcp")
@click.option("--user", help="the one user whose memory this server holds (the tools take no user id)")
@click.option("--tenant", help="the tenant whose users the sessions may be bound to (user ids '<tenant>:...', "
              "named per session by the host's Memstream-User header; streamable-http only)")
@click.option("--transport", type=click.Choice(["stdio", "streamable-http"]), default="stdio", show_default=True)
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535), help="streamable HTTP, on loopback")
@click.pass_context
def mcp_cmd(ctx: click.Context, user: str | None, tenant: str | None, transport: str, port: int) -> None:
    """Serve memory as MCP tools (remember, recall, get_context, list_memories, correct_memory, forget_memory)."""
    from memstream.schemas.errors import InvalidArgument

    try:
        from memstream.mcp_server import create_server
    except ImportError as exc:
        raise click.ClickException(f"the MCP server needs the 'mcp' extra: pip install 'memstream[mcp]' ({exc})") from None
    if tenant is not None and transport != "streamable-http":
        raise click.UsageError("--tenant serves streamable-http only: its host names each session's user in the "
                               "Memstream-User header (over stdio, serve one user with --user)")
    s = settings_of(ctx)
    try:
        server = create_server(s, user=user, tenant=tenant, dsn=resolve_dsn(s))
    except InvalidArgument as exc:
        raise click.UsageError(str(exc)) from None
    if transport == "stdio":
        server.run("stdio")
    else:
        logging.getLogger("memstream.mcp").warning(
            "streamable HTTP on 127.0.0.1:%d has no authentication: any local process reaches these users' memory; "
            "put it behind the host's own authentication", port)
        server.run("streamable-http", host="127.0.0.1", port=port)


@main.group("keys")
def keys_group() -> None:
    """The key store's key-encryption key (docs/erasure.md)."""


@keys_group.command("rotate")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def keys_rotate(ctx: click.Context, as_json: bool) -> None:
    """Make a new key-encryption key current, wrap every data key again under it and retire the
    old one (local: its file shredded; KMS: scheduled for deletion). Run it on a schedule: a
    forgotten person stays recoverable from a key-store backup only until the next rotation."""
    s = settings_of(ctx)
    rotation = asyncio.run(_rotate(s, resolve_dsn(s)))
    echo(dataclasses.asdict(rotation), as_json,
          [f"current {rotation.kek_id}; {rotation.rewrapped} keys wrapped again; "
           + (f"retired {', '.join(rotation.retired)}" if not rotation.left else
              f"{rotation.left} keys are bound to user ids no projection names: the old key-encryption key is kept")])
    if rotation.left:
        ctx.exit(1)


async def _rotate(s: Settings, dsn: str):
    from memstream.projections.db import create_pool
    from memstream.keys import data_keys
    from memstream.keys.rotation import rotate

    pool = await create_pool(dsn, s.postgres_schema, min_size=0, max_size=2)
    try:
        keys = await data_keys(s, pool)

        async def user_ids():  # keys wrapped before they were bound to the digest: their users
            async with pool.acquire() as conn:
                async with conn.transaction():
                    async for r in conn.cursor("SELECT user_id FROM episodes UNION SELECT user_id FROM memory_facts"):
                        yield r["user_id"]

        return await rotate(keys, user_ids())
    finally:
        await pool.close()


@main.group("api-keys")
def api_keys() -> None:
    """API keys for `memstream serve`: one per tenant (its users are '<tenant>:...'), or an operator's."""


@api_keys.command("create")
@click.argument("name")
@click.option("--tenant", help="the key reaches only this tenant's users (user ids '<tenant>:...')")
@click.option("--operator", is_flag=True, help="the key reaches every user and the operator routes")
@click.option("--expires-in", "expires_in", type=click.IntRange(1, 3650), help="days until the key stops working")
@click.pass_context
def api_keys_create(ctx: click.Context, name: str, tenant: str | None, operator: bool, expires_in: int | None) -> None:
    """Make a key called NAME and print it: the only time it is shown (only its hash is kept)."""
    from datetime import datetime, timedelta, timezone

    from memstream.schemas.errors import InvalidArgument

    if (tenant is None) == (not operator):
        raise click.UsageError("give --tenant TENANT or --operator")
    expires = datetime.now(timezone.utc) + timedelta(days=expires_in) if expires_in else None
    try:
        click.echo(_api_keys(ctx).create(name, tenant=tenant, expires_at=expires))
    except InvalidArgument as exc:
        raise click.ClickException(str(exc)) from None


@api_keys.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def api_keys_list(ctx: click.Context, as_json: bool) -> None:
    """Every key made (never the key itself): id, name, tenant, made, expires, revoked, active."""
    keys = _api_keys(ctx).list()
    echo(keys, as_json, [f"{k['id']}  {'active ' if k['active'] else 'ENDED  '} {k['tenant'] or '(operator)':<16} "
                          f"{k['name']}  made {k['created_at'][:19]}"
                          + (f", expires {k['expires_at'][:19]}" if k["expires_at"] else "")
                          + (f", revoked {k['revoked_at'][:19]}" if k["revoked_at"] else "") for k in keys])


@api_keys.command("revoke")
@click.argument("key_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def api_keys_revoke(ctx: click.Context, key_id: str, as_json: bool) -> None:
    """End the key KEY_ID (as `api-keys list` shows it) at once, in every server."""
    from memstream.schemas.errors import InvalidArgument

    try:
        key = _api_keys(ctx).revoke(key_id)
    except InvalidArgument as exc:
        raise click.ClickException(str(exc)) from None
    echo(key, as_json, [f"revoked {key['id']} ({key['name']})"])


def _api_keys(ctx: click.Context):
    from memstream.api.keys import ApiKeys

    return ApiKeys(Path(settings_of(ctx).home) / "api-keys.json")


@main.group("dead-letters")
def dead_letters() -> None:
    """Inspect the dead-letter topic and put fixed records back on the log."""


@dead_letters.command("list")
@click.option("--limit", type=click.IntRange(min=1), help="only the newest N")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dead_letters_list(ctx, limit: int | None, as_json: bool) -> None:
    """Every letter still on the topic: its name, when, which step refused it, whence, and why."""
    from memstream.streams.ops.dead_letters import Letter, letters

    found = [Letter.of(r) for r in typed(letters(log_settings(ctx), limit))]
    echo([x.as_dict() for x in found], as_json,
          [f"{x.name}  {x.at}  {x.stage:<10} {x.source}  {x.reason}" for x in found] or ["no dead letters"])


@dead_letters.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dead_letters_show(ctx, name: str, as_json: bool) -> None:
    """Letter NAME (PARTITION/OFFSET) in full: why, and the record as it was refused."""
    from memstream.streams.ops.dead_letters import Letter, letter

    r = typed(letter(log_settings(ctx), name))
    value = (r.value or b"").decode(errors="replace")
    echo({**Letter.of(r).as_dict(), "value": value}, as_json, [*(f"{k}: {v}" for k, v in Letter.of(r).as_dict().items()),
                                                              "", value])


@dead_letters.command("retry")
@click.argument("name")
@click.option("--fixed", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="append this file's bytes instead of the letter's record (the fixed record)")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dead_letters_retry(ctx, name: str, fixed: Path | None, as_json: bool) -> None:
    """Append letter NAME's record again (or --fixed FILE) where it belongs on the log."""
    from memstream.streams.ops.dead_letters import retry

    done = typed(retry(log_settings(ctx), name, fixed))
    echo(done, as_json, [f"letter {name} appended to {done['topic']}/{done['partition']}/{done['offset']}"])
