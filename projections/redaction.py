"""Keeping a database's quotes of a person's words out of letters and logs.

Postgres's DETAIL quotes the key or the row it refused, and asyncpg puts it in ``str(exc)``: a
letter's reason, a traceback or a ``%s`` of the exception would carry a person's words.
"""
from __future__ import annotations

import logging
import traceback

from asyncpg.exceptions._base import PostgresMessage

__all__ = ["redact_logs", "refusal"]


def refusal(exc: PostgresMessage) -> str:
    """What the server refused: its message and SQLSTATE, not the DETAIL."""
    return f"{type(exc).__name__} ({getattr(exc, 'sqlstate', None)}): {exc.args[0] if exc.args else ''}"


def redact_logs() -> None:
    """Make every log record made from now on, ours or a library's (Faust logs an agent's crash
    itself), carry database errors without their DETAIL. Idempotent."""
    made = logging.getLogRecordFactory()
    if getattr(made, "redacts", False):
        return

    def record(*args, **kwargs) -> logging.LogRecord:
        rec = made(*args, **kwargs)
        if isinstance(rec.args, tuple) and any(isinstance(a, PostgresMessage) for a in rec.args):
            rec.args = tuple(refusal(a) if isinstance(a, PostgresMessage) else a for a in rec.args)
        elif isinstance(rec.args, dict) and any(isinstance(a, PostgresMessage) for a in rec.args.values()):
            rec.args = {k: refusal(a) if isinstance(a, PostgresMessage) else a for k, a in rec.args.items()}
        if isinstance(rec.exc_info, tuple) and _quoting(rec.exc_info[1]):
            rec.exc_text = _traceback(rec.exc_info)  # formatters use it as it is
        return rec

    record.redacts = True
    logging.setLogRecordFactory(record)


def _quoting(exc: BaseException | None) -> list[PostgresMessage]:
    """The errors in ``exc``'s chain, as a traceback prints it, that carry a DETAIL."""
    found, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, PostgresMessage) and getattr(exc, "detail", None):
            found.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return found


def _traceback(exc_info) -> str:
    """The traceback as ``logging.Formatter.formatException`` writes it, written while the
    details are set aside (and put back after: the error is not ours to change)."""
    quoting = _quoting(exc_info[1])
    details = [e.detail for e in quoting]
    try:
        for e in quoting:
            e.detail = None
        return "".join(traceback.format_exception(*exc_info)).rstrip("\n")
    finally:
        for e, detail in zip(quoting, details):
            e.detail = detail
