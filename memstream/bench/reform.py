"""``memstream bench reform``: how fast ``memstream reform`` forms a whole log again, and whether
its rate holds as it goes.

``bench formation``'s fact-rich turns of ``users`` users are appended to fresh topics; then
``streams.ops.reform`` forms every one of them again, with the offline extractor, into a version
topic (from offset 0 it needs no worker and no decisions). A reform keeps every user's facts and
graph in memory, so the rate of its last tenth against its first says whether a turn's cost
grows with what it has formed before. Appending is not timed.
"""
from __future__ import annotations

import time

from memstream.bench import discarded, prepared
from memstream.bench.formation import append_backlog, fact_turns
from memstream.config import Settings


async def run_reform_bench(base: Settings, *, turns: int, users: int, on_progress=None) -> dict:
    from memstream.streams.ops.reform import reform

    settings, tag, dsn = await prepared(base, "benchrf")
    try:
        await append_backlog(settings, fact_turns(turns, users, tag))
        marks: list[tuple[float, int]] = []

        def progress(done: int, total: int) -> None:
            marks.append((time.perf_counter(), done))
            if on_progress:
                on_progress(done, total)

        report = await reform(settings, extractor="offline", topic=f"{settings.decisions_topic}.reform-offline",
                              on_progress=progress)
        return {"turns": turns, "users": users, "seconds": round(report.seconds, 1),
                "events_per_s": round(report.reformed_events / report.seconds, 1),
                "new_decisions": report.new_decisions,
                "first_tenth_events_per_s": _rate(marks, 0.0, 0.1),
                "last_tenth_events_per_s": _rate(marks, 0.9, 1.0)}
    finally:
        await discarded(settings, dsn)


def _rate(marks: list[tuple[float, int]], lo: float, hi: float) -> float | None:
    """Events per second while the reform went from ``lo`` to ``hi`` of the events, between the
    batches that ended inside that stretch; None when fewer than two did (a log too short)."""
    total = marks[-1][1] if marks else 0
    inside = [(t, n) for t, n in marks if lo * total <= n <= hi * total]
    if len(inside) < 2 or inside[-1][0] == inside[0][0]:
        return None
    return round((inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]), 1)
