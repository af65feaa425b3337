"""``memstream demo``: the whole pipeline on the local stack, end to end, in one command.

Brings the stack up, migrates, starts a worker, appends a scripted multi-session conversation
for a few users, waits until the projection has applied it (read-your-writes), and prints each
user's ``MemoryContext`` for a few questions. Event ids are derived from the script, so running
the demo twice appends the same events again — and the memory comes out the same.
"""
from __future__ import annotations

import hashlib
import logging
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import click

from memstream.config import Settings
from memstream.schemas import LogPosition, TurnRecorded

log = logging.getLogger("memstream.demo")

START = datetime(2026, 9, 1, 9, 0, tzinfo=timezone.utc)

# user -> sessions (days after START) -> turns (user says, assistant answers)
SCRIPT: dict[str, list[tuple[int, list[tuple[str, str]]]]] = {
    "maria": [
        (0, [("Hi! I'm Maria. I live in Lisbon and work as a data engineer at Acme Corp.",
              "Nice to meet you, Maria! What do you work on at Acme?"),
             ("Mostly streaming pipelines with Kafka. My dog Rex keeps me company while I code.",
              "Rex sounds like a great coworker."),
             ("I'm allergic to peanuts, so please never suggest recipes with them.",
              "Noted: no peanuts, ever.")]),
        (9, [("Rex and I hiked the Sintra trails this weekend, he loved the forest.",
              "Sintra is beautiful. Did Rex manage the steep parts?"),
             ("He did! Next month I'm flying to Berlin for a Kafka conference.",
              "Exciting! Is it your first time in Berlin?")]),
        (30, [("Big news: I accepted an offer and I'm moving to Berlin in November.",
               "Congratulations! Will Rex come with you?"),
              ("Of course, Rex comes with me. I need a flat near a park for him.",
               "Prenzlauer Berg and Tempelhof have great parks for dogs.")]),
        (75, [("I moved to Berlin last week, our flat is right next to Tempelhof field.",
               "Welcome to Berlin! Rex must love the field."),
              ("I just joined Zalando as a data engineer, my manager is Jonas.",
               "Congratulations on the new job!"),
              ("I'm allergic to peanuts, as you know. Any good restaurants nearby?",
               "Try the Vietnamese places on Kottbusser Damm, they can cook without peanuts.")]),
    ],
    "tom": [
        (2, [("I'm Tom, I've been vegetarian for ten years.", "Good to know, Tom."),
             ("My daughter Lily turns 7 on October 12th and she loves dinosaurs.",
              "A dinosaur party could be fun!")]),
        (15, [("I started learning Japanese because we're visiting Kyoto in April.",
               "Kyoto in spring is wonderful. How is the Japanese going?"),
              ("Slowly. I practise hiragana every morning on the train to work.",
               "Consistency is the key with kana.")]),
        (40, [("Lily's dinosaur party was a hit, thanks for the cake idea.",
               "So glad it went well!")]),
    ],
    "aisha": [
        (5, [("I'm training for the Porto marathon in November.", "Great goal! What's your plan?"),
             ("Four runs a week, long run on Sundays. My best 10k is 48 minutes.",
              "That's a solid base for a marathon.")]),
        (20, [("I hurt my left knee on a long run, my physio is Dr. Costa.",
               "Sorry to hear that. What did Dr. Costa recommend?"),
              ("Two weeks of cycling instead of running, then a slow return.",
               "Sensible. Cycling keeps your fitness up.")]),
        (35, [("My favourite book this year is Project Hail Mary, I read it on the bike trainer.",
               "Great pick, the audiobook is excellent too.")]),
    ],
}

QUESTIONS = {
    "maria": ["Where do I live now?", "Who is my manager?", "What should I cook for dinner?", "How is Rex doing?"],
    "tom": ["Any ideas for Lily's next birthday?", "How is the Japanese going?"],
    "aisha": ["Can I run the long route this Sunday?", "Recommend me a book"],
}


def _event_id(occurred_at: datetime, *parts: str) -> uuid.UUID:
    """A UUIDv7 whose time is the turn's and whose random bits come from the script."""
    raw = bytearray(int(occurred_at.timestamp() * 1000).to_bytes(6, "big")
                    + hashlib.sha256("/".join(parts).encode()).digest()[:10])
    raw[6] = (raw[6] & 0x0F) | 0x70
    raw[8] = (raw[8] & 0x3F) | 0x80
    return uuid.UUID(bytes=bytes(raw))


def script_turns(users: int) -> list[TurnRecorded]:
    out = []
    for user in list(SCRIPT)[:users]:
        for session, (day, turns) in enumerate(SCRIPT[user]):
            for i, (said, answer) in enumerate(turns):
                at = START + timedelta(days=day, minutes=3 * i)
                out.append(TurnRecorded(
                    event_id=_event_id(at, user, str(session), str(i)), user_id=user,
                    conversation_id=f"{user}-s{session + 1}", occurred_at=at,
                    user_message=said, assistant_message=answer))
    return out


def _show(ctx, question: str) -> None:
    click.secho(f"\n── {ctx.user_id}: {question!r}   ({ctx.timings_ms.get('total', 0):.1f} ms"
                f"{', degraded: ' + ', '.join(ctx.degraded) if ctx.degraded else ''})", bold=True)
    click.echo(f"   recent turns in {ctx.conversation_id}:")
    for t in ctx.recent_turns[-3:]:
        click.echo(f"     · {t.user_message}")
    click.echo("   ranked facts:")
    for i, f in enumerate(ctx.facts[:5], 1):
        seen = f", seen {f.observation_count}x" if f.observation_count > 1 else ""
        click.echo(f"     {i}. [{f.score:.2f}] {f.text}  ({f.category}, confidence {f.confidence:.2f}{seen})")
    if ctx.edges:
        click.echo("   relationships:")
        for e in ctx.edges[:4]:
            until = f"until {e.valid_to:%Y-%m-%d}" if e.valid_to else "now"
            via = "  (one hop)" if e.hop else ""
            click.echo(f"     · [{e.score:.2f}] {e.fact_sentence}  ({e.valid_from:%Y-%m-%d} → {until}){via}")
    click.echo("   ranked episodes:")
    for e in sorted(ctx.episodes, key=lambda e: e.rank):
        click.echo(f"     {e.rank}. [{e.score:.2f} {'+'.join(e.channels):<14}] {e.occurred_at:%Y-%m-%d} "
                   f"{e.conversation_id}: {e.user_message}")


async def _show_history(reader, user: str, attribute: str) -> None:
    current = [f for f in await reader.current_facts(user) if f["attribute"] == attribute]
    if not current:
        return
    click.secho(f"\n── history of {user}'s {attribute} (a later turn superseded the earlier one; nothing is deleted)", bold=True)
    for v in await reader.fact_history(user, current[0]["fact_id"]):
        until = f"until {v.valid_to:%Y-%m-%d}" if v.valid_to else "until now"
        click.echo(f"     v{v.version} {v.text:<22} {v.status:<10} true from {v.valid_from:%Y-%m-%d} {until}; "
                   f"recorded because: {v.reason}" + (f"; ended because: {v.end_reason}" if v.end_reason else ""))


async def _show_as_of(reader, user: str) -> None:
    from memstream.schemas.read_models import AsOf

    click.secho(f"\n── {user}'s employer, as of two dates (bi-temporal graph: closed edges keep their interval)", bold=True)
    for when in (START + timedelta(days=10), START + timedelta(days=80)):
        ctx = await reader.read(user, "as-of", "where do I work?", as_of=AsOf(valid_time=when))
        works = [e for e in ctx.edges if e.relation == "works_at"]
        click.echo(f"     {when:%Y-%m-%d}: " + (", ".join(f"{e.fact_sentence} ({e.valid_from:%Y-%m-%d} → "
                   f"{e.valid_to:%Y-%m-%d})" if e.valid_to else f"{e.fact_sentence} (since {e.valid_from:%Y-%m-%d})"
                   for e in works) or "nothing known"))


def demo_settings(base: Settings) -> Settings:
    """The demo's own topics, group and schema: it never touches the deployment's."""
    return base.model_copy(update={
        "events_topic": "memstream.demo.events", "decisions_topic": "memstream.demo.decisions",
        "dead_letter_topic": "memstream.demo.dead-letter", "ingress_topic": "memstream.demo.ingress",
        "group_id": "memstream-demo",
        "postgres_schema": "memstream_demo" if base.postgres_schema == "memstream" else base.postgres_schema,
    })


async def run_demo(base: Settings, users: int = 3) -> None:
    from memstream.projections.db import migrate
    from memstream.read_client import MemoryReader
    from memstream.stack.launcher import stack_from_settings
    from memstream.stack.worker_process import WorkerProcess
    from memstream.streams.log.producer import TurnLog
    from memstream.streams.log.topics import ensure_topics

    settings = demo_settings(base)
    click.secho("1/5 starting the local stack (Kafka, Postgres+pgvector, Redis)…", bold=True)
    stack = stack_from_settings(settings)
    stack.up()
    for s in stack.status():
        click.echo(f"    {s.name:<9} {'up' if s.answers else 'DOWN'}  {s.address}")
    dsn = settings.dsn()
    crash_mark = stack.postgres.log_size()
    click.secho("2/5 creating topics and migrating schema " + settings.postgres_schema, bold=True)
    await ensure_topics(settings)
    await migrate(dsn, settings.postgres_schema)
    click.secho("3/5 starting a worker (formation + projections)", bold=True)
    with WorkerProcess(settings, Path(settings.home) / "logs" / "demo-worker.log") as worker:
        turns = script_turns(users)
        click.secho(f"4/5 appending {len(turns)} turns for {users} users to {settings.events_topic}", bold=True)
        t0 = time.perf_counter()
        async with TurnLog(settings) as turn_log:
            positions = await turn_log.append_many(turns)
        click.echo(f"    acknowledged in {(time.perf_counter() - t0) * 1000:.0f} ms (acks=all, idempotent)")
        last: dict[str, LogPosition] = {}
        for turn, pos in zip(turns, positions):
            last[turn.user_id] = pos
        click.secho("5/5 reading memory (waits until each user's last turn is projected)", bold=True)
        reader = await MemoryReader.connect(settings, dsn)
        try:
            for user in list(SCRIPT)[:users]:
                conversation = f"{user}-s{len(SCRIPT[user])}"
                for i, question in enumerate(QUESTIONS[user]):
                    if i == 0:  # up to two minutes on a slow first run (one wait is a minute at most)
                        for _ in range(2):
                            if await reader.caught_up(last[user], timeout=60):
                                break
                    ctx = await reader.read(user, conversation, question,
                                            after=last[user] if i == 0 else None, wait_timeout=1)
                    if not ctx.caught_up:
                        if crashes := stack.postgres.crashes(since=crash_mark):
                            raise click.ClickException(
                                f"Postgres crashed while the worker projected {user}'s turns: " + "; ".join(crashes)
                                + f" (server log: {stack.postgres.pgdata / 'log'})")
                        raise click.ClickException(f"the worker did not project {user}'s turns; see {worker.log_path}")
                    _show(ctx, question)
            await _show_history(reader, "maria", "home")
            await _show_as_of(reader, "maria")
        finally:
            await reader.close()
    click.secho(f"\nDone. The stack is still running (memstream stack status / memstream stack down); "
                f"worker log: {worker.log_path}", bold=True)
    click.secho("\nSee, correct and forget these users' memory in a browser — the memory inspector:", bold=True)
    click.echo("    memstream serve --demo      (.venv/bin/memstream from this checkout)\n"
               "    then open the sign-in link it prints: http://127.0.0.1:8080/inspector#key=…&user=maria")
