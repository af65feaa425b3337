"""Pure parts of the read path: the gate, token budgets, Tier 1 profile, commands, rendering."""
import random
import string
import uuid
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import msgspec
import pytest

from memstream.projections.commands.core import Logged, UnknownReminder
from memstream.projections.commands.core import apply as apply_logged
from memstream.projections.profile.core import build_profile
from memstream.read_client.budget import TokenCounter, pack
from memstream.read_client.retrieval_gate import needs_retrieval
from memstream.read_client.render import render_prompt
from memstream.schemas import ExpertIdentityDeleted, ReminderResolved, ReminderScheduled
from memstream.schemas.events import new_event_id
from memstream.schemas.read_models import MemoryContext, Reminder

T = datetime(2026, 4, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize("message", ["ok", "Thanks!", "thank you so much", "lol", "👍", "", "got it, thanks",
                                     "ok cool", "Good morning!"])
def test_trivial_messages_skip_retrieval(message):
    assert needs_retrieval(message) is False


@pytest.mark.parametrize("message", ["ok?", "where do I live", "thanks, what was my dog's name?", "Remind me about Lily",
                                     "I need a restaurant for tonight"])
def test_anything_with_content_or_a_question_retrieves(message):
    assert needs_retrieval(message) is True


def test_budgets_count_real_tokens_and_keep_rank_order():
    counter = TokenCounter()
    assert counter.count("I live in Lisbon") == 4
    items = ["short one", "a much much longer item that will not fit in the small budget at all", "tiny"]
    kept, used = pack(items, lambda s: s, 5, counter)
    assert kept == ["short one", "tiny"] and used == counter.count("short one") + counter.count("tiny") <= 5


def test_token_counts_match_the_tokenizers_whole_pipeline():
    # The word-by-word count must equal a full encode for any text: control characters,
    # punctuation runs, digits, words past WordPiece's 100-character limit, and non-ASCII text.
    counter, rng = TokenCounter(), random.Random(7)
    alphabet = string.printable + "\x00\x01\x0b\x0c\x1c\x7f"
    words = ["Caroline", "painted", "a", "sunset", "LGBTQ", "2023-05-08", "don't", "x" * 120, "re-uploaded"]
    texts = ["", "   ", "I live in Lisbon", "Café crème at Zoë's", "東京に住んでいる", "emoji 🎉 party", "naïve\u00a0space"]
    for i in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 50)))
        texts.append(" ".join(rng.choice(words) for _ in range(rng.randint(0, 6))) + text if i % 2 else text)
    assert [counter.count(t) for t in texts] == [counter.encoded(t) for t in texts]


def fact(attribute, value, category="x", seen=1, days=0, text=None):
    return {"attribute": attribute, "value": value, "category": category, "observation_count": seen,
            "recorded_at": T + timedelta(days=days), "text": text or f"{attribute} {value}"}


def test_the_profile_is_small_deterministic_and_prefers_repeated_facts():
    facts = [fact("name", "Maria"), fact("home", "Berlin"), fact("allergy", "peanuts", seen=3),
             fact("allergy", "pollen"), fact("likes", "hiking", seen=2), fact("likes", "jazz", days=1),
             fact("favourite_book", "Dune"), fact("daughter", "Lily"), fact("trip", "Kyoto", "plan", text="Plans a trip to Kyoto")]
    p = build_profile(facts)
    assert p == {"name": "Maria", "home": "Berlin", "allergies": ["peanuts", "pollen"], "likes": ["hiking", "jazz"],
                 "favourites": {"book": "Dune"}, "family": {"daughter": ["Lily"]}, "plans": ["Plans a trip to Kyoto"]}
    assert build_profile(reversed(facts)) == p
    assert len(build_profile([fact("likes", f"thing {i}") for i in range(20)])["likes"]) == 5


def apply(state, event, offset: int = 0):
    return apply_logged(state, Logged(offset, event))


def test_reminders_resolve_once_and_unknown_ones_are_refused():
    s = ReminderScheduled.new(user_id="u", text="call the dentist", due_at=T, occurred_at=T - timedelta(days=1))
    (row,) = apply({}, s)
    assert row.status == "pending" and row.due_at == T
    done = ReminderResolved(event_id=new_event_id(), user_id="u", occurred_at=T, reminder_id=s.reminder_id, status="done")
    (closed,) = apply({("u", s.reminder_id): row}, done)
    assert closed.status == "done" and apply({("u", s.reminder_id): closed}, done) == []
    with pytest.raises(UnknownReminder):
        apply({}, ReminderResolved(event_id=new_event_id(), user_id="u", occurred_at=T, reminder_id=uuid.uuid4(), status="dismissed"))
    with pytest.raises(UnknownReminder):  # another user's reminder
        apply({("u", s.reminder_id): row}, ReminderResolved(event_id=new_event_id(), user_id="v", occurred_at=T,
                                                            reminder_id=s.reminder_id, status="done"))
    # The same reminder id scheduled by another user (one event id for both) is theirs, not a repeat.
    (theirs,) = apply({("u", s.reminder_id): row}, msgspec.structs.replace(s, user_id="v"))
    assert (theirs.user_id, theirs.reminder_id) == ("v", s.reminder_id)
    assert apply({}, ExpertIdentityDeleted(event_id=new_event_id(), user_id="__memstream__", occurred_at=T, identity_id="x"))


def test_render_prompt_is_compact_and_keeps_the_message_last():
    ctx = MemoryContext(user_id="u", conversation_id="c", message="hi", profile={"name": "Maria", "likes": ["jazz"]},
                        expert_identity={"name": "Email writer", "instructions": "Be concise."},
                        due_reminders=[Reminder(reminder_id=uuid.uuid4(), text="call mom", due_at=T)])
    text = render_prompt(ctx, "What now?")
    assert text.startswith("<memory>\nPersona: Email writer\nBe concise.")
    assert "Profile: name: Maria; likes: jazz" in text and "- call mom (due 2026-04-01 00:00)" in text
    assert text.endswith("User: What now?")
    assert render_prompt(MemoryContext(user_id="u", conversation_id="c", message="x"), "x") == "User: x"


@pytest.mark.parametrize("message, terms", [
    ("What did I say about my trip to Kyoto?", ["Kyoto"]),
    ("Where do I work these days?", []),
    ("Is invoice INV-2291 paid?", ["INV-2291"]),
    ("Did Ana like Project Hail Mary?", ["Ana", "Project", "Hail", "Mary"]),
    ("remind me about the iPhone repair on 12/3", ["iPhone", "12/3"]),
])
def test_names_mode_searches_only_names_ids_and_numbers(message, terms):
    from memstream.read_client.terms import keyword_terms

    assert keyword_terms(message) == terms


def test_a_message_of_thousands_of_names_gives_its_first_terms_once_each():
    from memstream.read_client.terms import MAX_KEYWORD_TERMS, keyword_terms

    # 31,000 distinct capitalised words (a pasted document): checked against a list, 7 s on the event loop.
    words = [f"Name{n}" for n in range(31_000)]
    got = keyword_terms(" ".join(["Kyoto", "Kyoto", *words]))
    assert got == ["Kyoto", *words[:MAX_KEYWORD_TERMS - 1]]


def test_tier_0_gets_what_no_later_forget_of_the_batch_forgot():
    from memstream.projections.episodes.core import episode_id
    from memstream.schemas import LogPosition, MemoryForgotten
    from memstream.streams.worker.projecting import _not_forgotten_after

    def row(user, n):
        return SimpleNamespace(user_id=user, episode_id=uuid.UUID(int=n))

    def forget(user, kind, target=None):
        return MemoryForgotten(decision_id=uuid.uuid4(), source_event_id=uuid.uuid4(), user_id=user, kind=kind,
                               target=target, actor="user", source=LogPosition("e", 0, 0),
                               recorded_at=datetime(2026, 1, 1, tzinfo=timezone.utc))

    said = uuid.uuid4()
    gone_turn = SimpleNamespace(user_id="bo", episode_id=episode_id(said))
    rows = [(None, r) for r in (row("ana", 1), gone_turn, forget("ana", "user"), row("ana", 2),
                                forget("bo", "episode", said), row("bo", 3))]
    # Ana's turn before her forget goes, the one after (she came back) stays; Bo's forgotten turn goes.
    assert [r.episode_id.int for r in _not_forgotten_after(rows)] == [2, 3]
