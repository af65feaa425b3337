"""Commands for local development: the local stack, the demo, the wire format's JSON Schema."""
from __future__ import annotations

import asyncio

import click

from memstream.cli.base import main, settings_of


@main.group()
def stack() -> None:
    """The local stack: Kafka, Postgres+pgvector and Redis on loopback."""


@stack.command("up")
@click.pass_context
def stack_up(ctx: click.Context) -> None:
    """Start (or reuse) every local service."""
    from memstream.stack.launcher import StackError, stack_from_settings

    try:
        stack_from_settings(settings_of(ctx)).up()
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc
    ctx.invoke(stack_status)


@stack.command("down")
@click.pass_context
def stack_down(ctx: click.Context) -> None:
    """Stop every local service."""
    from memstream.stack.launcher import stack_from_settings

    stack_from_settings(settings_of(ctx)).down()
    click.echo("stack stopped")


@stack.command("status")
@click.pass_context
def stack_status(ctx: click.Context) -> None:
    """Show each local service, its address and whether it answers."""
    from memstream.stack.launcher import stack_from_settings

    rows = stack_from_settings(settings_of(ctx)).status()
    for s in rows:
        click.echo(f"{s.name:<9} {'up  ' if s.answers else 'DOWN'}  {s.address}  {s.detail}")
    if not all(s.answers for s in rows):
        ctx.exit(1)


@main.command()
@click.option("--users", default=3, show_default=True, type=click.IntRange(min=1))
@click.pass_context
def demo(ctx: click.Context, users: int) -> None:
    """Start the stack, run the pipeline end to end and print each user's memory context."""
    from memstream.demo import run_demo

    asyncio.run(run_demo(settings_of(ctx), users=users))


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
