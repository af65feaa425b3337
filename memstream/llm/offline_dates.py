"""When a sentence says a thing happened, for the offline extractors: "last week", "two days ago",
"in October", "on May 3rd", read relative to when the turn was said. A date dates only the phrase
of its own clause."""
from __future__ import annotations

import calendar
import re
from datetime import datetime, timedelta

from memstream.schemas.events import in_range

MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_name) if m}
MONTHS.update({m.lower(): i for i, m in enumerate(calendar.month_abbr) if m})
LONG_MONTHS = "|".join(m.lower() for m in calendar.month_name if m)  # "may" too, not "mar"
NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "a couple of": 2, "a few": 3}
COUNTS = "|".join(NUMBERS)
AGO = re.compile(r"\b(\d{1,3}|%s)\s+(day|week|month|year)s?\s+ago\b" % COUNTS)
UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}
# Where a clause ends: a date beyond it is said of something else ("I moved to Lisbon, and my
# daughter turns 7 on October 12th").
CLAUSE_END = re.compile(r"[,;:!?]|\s(?:and|but|so|because|while|though|although|whereas|when|after|before)\s", re.I)


def when_said(text: str, at: datetime, past: bool = False) -> datetime | None:
    """World time a phrase refers to, relative to when the turn happened. ``past``: the phrase
    tells what already happened ("moved to Lisbon in October"), so a bare month is the last one.
    None past the times memstream stores ("999 years ago", said in the year 500)."""
    try:
        when = _phrase_time(text, at, past)
    except OverflowError:
        return None
    return when if when is None or in_range(when) else None


def _phrase_time(text: str, at: datetime, past: bool) -> datetime | None:
    t = text.lower()
    for phrase, delta in (("last month", -30), ("next month", 30), ("last week", -7), ("next week", 7),
                          ("yesterday", -1), ("tomorrow", 1), ("last year", -365), ("next year", 365)):
        if phrase in t:
            return at + timedelta(days=delta)
    m = AGO.search(t)
    if m:
        n = int(m.group(1)) if m.group(1).isdigit() else NUMBERS[m.group(1)]
        return at - timedelta(days=n * UNIT_DAYS[m.group(2)])
    m = re.search(r"\b(?:on |in )?(%s)\b(?:\s+(\d{1,2})(?:st|nd|rd|th)?)?" % "|".join(MONTHS), t)
    if m:
        month, day = MONTHS[m.group(1)], int(m.group(2) or 1)
        if past:
            year = at.year - (1 if (month, day) > (at.month, at.day) else 0)
        else:
            year = at.year + (1 if (month, day) < (at.month, at.day) and " in " + m.group(1) in " " + t else 0)
        try:
            return at.replace(year=year, month=month, day=day, hour=0, minute=0, second=0, microsecond=0)
        except ValueError:
            return None
    return None


def clause_after(text: str) -> str:
    end = CLAUSE_END.search(text)
    return text[:end.start()] if end else text


NEAR = 300  # characters around a match that say how it is meant (its date, a hedge)


def date_of(sentence: str, start: int, end: int, at: datetime, past: bool = False) -> datetime | None:
    """The date of the phrase at ``sentence[start:end]``: one said in its own clause, after it or
    before it ("Last week, I moved to Lisbon"), never one said of something else in the sentence."""
    # Within NEAR characters either side: a clause is shorter, and a pasted page must not make
    # every match read all of it.
    when = when_said(clause_after(sentence[end:end + NEAR]), at, past)
    if when is None:
        clauses = CLAUSE_END.split(sentence[max(0, start - NEAR):start])
        when = when_said(clauses[-1], at, past)
        if (when is None and start <= NEAR and len(clauses) == 2 and not clauses[-1].strip()
                and len(clauses[0].split()) <= 4):
            when = when_said(clauses[0], at, past)  # a leading adverbial: "Last week, I ..."
    return when
