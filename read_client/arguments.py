"""``read``'s arguments, refused before any I/O with what is wrong: a bad one would otherwise
surface as degraded sections (a non-string id, a NUL character or a lone surrogate in the
message), a silently wrong result (a negative k) or an exception from the middle of ranking (a
naive ``now``)."""
from __future__ import annotations

from datetime import datetime

from memstream.read_client.budget import Budgets
from memstream.schemas import SYSTEM_USER, LogPosition
from memstream.schemas.errors import InvalidArgument, not_utf8
from memstream.schemas.events import STORABLE_TIMES, in_range
from memstream.read_settings import MAX_K
from memstream.schemas.read_models import AsOf


def check_user(user_id) -> None:
    """A user's id as the log takes it: a non-empty string, storable, not the host-wide key."""
    if not isinstance(user_id, str) or not user_id:
        raise InvalidArgument(f"user_id is required: a non-empty string, not {user_id!r}")
    storable("user_id", user_id)
    if user_id == SYSTEM_USER:
        raise InvalidArgument(f"user_id {SYSTEM_USER!r} is the host-wide key, not a user: nobody's memory is under it")


def check_read(user_id, conversation_id, message, *, after, k, k_facts, k_edges, wait_timeout, now, as_of,
               identity_id, budgets, include_archived=False) -> None:
    check_user(user_id)
    if not isinstance(include_archived, bool):
        raise InvalidArgument(f"include_archived must be true or false, not {include_archived!r}")
    if not isinstance(conversation_id, str) or not conversation_id:
        raise InvalidArgument(f"conversation_id is required: a non-empty string, not {conversation_id!r}")
    if not isinstance(message, str):
        raise InvalidArgument(f"message must be a string, not {type(message).__name__}")
    for name, value in (("conversation_id", conversation_id), ("message", message), ("identity_id", identity_id)):
        if isinstance(value, str):
            storable(name, value)
    for name, value, least in (("k", k, 1), ("k_facts", k_facts, 0), ("k_edges", k_edges, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= MAX_K:
            raise InvalidArgument(f"{name} must be an integer from {least} to {MAX_K}, not {value!r}")
    if after is not None:
        check_position("after", after)
    if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float)) or not 0 <= wait_timeout <= 60:
        raise InvalidArgument(f"wait_timeout must be a number of seconds from 0 to 60, not {wait_timeout!r}")
    times = [("now", now)]
    if isinstance(as_of, AsOf):
        times += [("as_of.valid_time", as_of.valid_time), ("as_of.recorded_time", as_of.recorded_time)]
    elif as_of is not None:
        times.append(("as_of", as_of))
    _aware(times)
    if identity_id is not None and (not isinstance(identity_id, str) or not identity_id):
        raise InvalidArgument(f"identity_id must be a non-empty string or None, not {identity_id!r}")
    if budgets is not None and not isinstance(budgets, Budgets):
        raise InvalidArgument(f"budgets must be a Budgets, not {type(budgets).__name__}")


SEARCH_KINDS = ("facts", "episodes", "edges")


def check_position(name: str, position) -> None:
    """A ``LogPosition`` as an append returns one: a wait for any other is never over."""
    if not isinstance(position, LogPosition):
        raise InvalidArgument(f"{name} must be the LogPosition an append returned, not {type(position).__name__}")
    if not isinstance(position.topic, str) or not position.topic or any(
            not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in (position.partition, position.offset)):
        raise InvalidArgument(f"{name} must name a topic and a partition and offset >= 0, not {position!r}")


def check_search(user_id, query, *, kinds, k, as_of, now, since=None, until=None) -> None:
    check_user(user_id)
    if not isinstance(query, str) or not query.strip():
        raise InvalidArgument(f"query must be a non-blank string, not {query!r}")
    storable("query", query)
    if len(query) > 10_000:
        raise InvalidArgument(f"query is at most 10000 characters, not {len(query)}")
    if not isinstance(kinds, (list, tuple)) or not kinds or any(kind not in SEARCH_KINDS for kind in kinds):
        raise InvalidArgument(f"kinds must be a non-empty sequence of {', '.join(SEARCH_KINDS)}, not {kinds!r}")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise InvalidArgument(f"k must be an integer from 1 to {MAX_K}, not {k!r}")
    _aware([("now", now), ("since", since), ("until", until)])
    if since is not None and until is not None and since >= until:
        raise InvalidArgument("since must be before until")
    check_as_of(as_of)


def check_as_of(as_of) -> None:
    """None, a timezone-aware datetime, or an ``AsOf`` of them."""
    if isinstance(as_of, AsOf):
        _aware([("as_of.valid_time", as_of.valid_time), ("as_of.recorded_time", as_of.recorded_time)])
    else:
        _aware([("as_of", as_of)])


def _aware(times) -> None:
    for name, value in times:
        if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
            # A naive time would be read in some zone nobody chose: off by hours on both time axes.
            raise InvalidArgument(f"{name} must be a timezone-aware datetime, not {value!r}")
        if value is not None and not in_range(value):  # it would overflow in UTC, in every channel
            raise InvalidArgument(f"{name} must fall {STORABLE_TIMES}, not {value!r}")


def storable(name: str, text: str) -> None:
    """What Postgres text and the tokenizer can take: the same rule as the producer's for turns."""
    if "\x00" in text:
        raise InvalidArgument(f"{name} must not contain NUL characters")
    if why := not_utf8(text):
        raise InvalidArgument(f"{name} is not valid Unicode: {why}")
