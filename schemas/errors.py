"""Typed errors raised at the edge when a record or a command is not acceptable."""


class InvalidEvent(ValueError):
    """An event failed validation. ``field`` is a JSON path such as ``$.user_id``."""

    def __init__(self, reason: str, field: str | None = None):
        self.reason = reason
        self.field = field
        super().__init__(f"{field}: {reason}" if field else reason)


class UnknownEventType(InvalidEvent):
    """The ``type`` tag or its ``schema_version`` is not one this build can read."""
