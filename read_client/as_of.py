"""Reads "as of" a moment, on both time axes: what held in the world then (valid time) and what
memstream had recorded by then (recorded time)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from memstream.schemas.read_models import AsOf


def both_axes(as_of: AsOf | datetime | None, now: datetime) -> AsOf | None:
    """``as_of`` with both axes set: a bare time is both; a missing axis is the other one, or now."""
    if isinstance(as_of, datetime):
        as_of = AsOf(valid_time=as_of, recorded_time=as_of)
    if as_of is None:
        return None
    recorded = as_of.recorded_time or now
    return AsOf(valid_time=as_of.valid_time or recorded, recorded_time=recorded)

EARLIEST = datetime(1, 1, 2, tzinfo=timezone.utc)

LATEST = datetime(9999, 12, 30, tzinfo=timezone.utc)

INSTANT = timedelta(microseconds=1)  # a period's end is open: "by" a time includes it

def channel_args(as_of: AsOf | None, period: tuple | None = None) -> tuple[tuple, tuple]:
    """The extra arguments of the facts and the episodes channels for a read ``as_of`` a moment
    (and ``period``): the facts as they held and were believed then; the episodes that occurred
    by its valid time (``believed`` keeps those recorded by its recorded time)."""
    if as_of is None:
        return (), ((period,) if period else ())
    since, until = period or (EARLIEST, LATEST)
    return (as_of,), ((since, min(until, as_of.valid_time + INSTANT)),)

def believed(cands: list, as_of: AsOf | None) -> list:
    """The episodes a read ``as_of`` a moment may hold: occurred by its valid time, recorded by
    its recorded time (adjacent turns included)."""
    if as_of is None:
        return cands
    return [c for c in cands if c.row["occurred_at"] <= as_of.valid_time and c.row["recorded_at"] <= as_of.recorded_time]

def within(cands: list, period: tuple | None) -> list:
    """The candidates that occurred in [since, until) (adjacent turns may fall outside it)."""
    if period is None:
        return cands
    return [c for c in cands if period[0] <= c.row["occurred_at"] < period[1]]
