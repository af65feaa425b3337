"""Typed errors raised at the edge when a record or a command is not acceptable."""


class InvalidEvent(ValueError):
    """An event failed validation. ``field`` is a JSON path such as ``$.user_id``."""

    def __init__(self, reason: str, field: str | None = None):
        self.reason = reason
        self.field = field
        super().__init__(f"{field}: {reason}" if field else reason)


class UnknownEventType(InvalidEvent):
    """The ``type`` tag or its ``schema_version`` is not one this build can read."""


def not_utf8(text: str) -> str | None:
    """Why ``text`` cannot be written as UTF-8 (a lone surrogate), or None if it can: no JSON for
    the log, no Postgres text, no tokens for it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{exc.reason} at {exc.start}"
    return None
