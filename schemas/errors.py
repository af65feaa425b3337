"""The errors memstream raises on purpose, and the typed errors of the edge.

Every one derives from ``MemstreamError``, and its kind says what a worker does with a batch in
which it was raised (``streams.worker.runtime``: one ``except`` per kind):

* ``Retryable`` — a passing condition (a broker or database out of reach, a projection that
  lags, a model throttled): the same batch is retried in place, nothing acknowledged (a
  model's unusable answer is retried only so often: ``memstream.llm.protocols.Unanswered``);
* ``Refused`` — this record can never be applied as it is (undecodable, invalid, naming a row
  the store does not hold): it goes to the dead-letter topic with the reason, the rest of the
  batch is applied;
* anything else — a bug or a broken deployment: the worker stops without acknowledging.

Errors of other libraries are translated into these kinds at their seams — Postgres's and
Kafka's at ``streams.log.errors.as_retryable``, a model service's in its adapter
(``memstream.llm.bedrock``) — so the rest never decides by matching names.
"""


class MemstreamError(Exception):
    """The root of every error memstream raises on purpose."""


class Retryable(MemstreamError):
    """The same work will succeed later: retry it, never skip it (``Unanswered`` alone is given up
    after its attempts, as ``Refused``)."""


class Refused(MemstreamError):
    """This record cannot be applied: dead-letter it with this error's message as the reason.
    ``users_input``: the record is its user's own mistake by our rules (a request naming what
    they do not have), so its letter never counts toward the rate that stops the worker; other
    refusals (a decision naming a row the store lacks: the log is inconsistent) do."""

    users_input = False


class InvalidArgument(MemstreamError, ValueError):
    """A call's argument is not acceptable; the message names it and says why. Raised before any I/O."""


class ReaderClosed(MemstreamError, RuntimeError):
    """A read on a ``MemoryReader`` after ``close()``."""


class InvalidEvent(Refused, ValueError):
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
