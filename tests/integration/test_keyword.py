"""The keyword channel's SQL against a plain Python statement of what it promises (projections/
fulltext.py): candidates are the rows holding any query word among the user's newest RECENT rows
plus the rows holding every word at any age; each scores the sum of the idf of the words it
holds (document frequencies over the newest rows); the k best by (score, time, id). The corpus
is written straight into the table (150 rows more than the window), so the postings triggers,
the window and the all-words path are all exercised."""
from __future__ import annotations

import math
import random
import uuid
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from memstream.projections.episodes import query as episodes_q
from memstream.projections.episodes.query import KEYWORD_WINDOW as RECENT
from memstream.projections.fulltext import CAP, MAX_TERMS

T0 = datetime(2025, 3, 1, tzinfo=timezone.utc)
COMMON = ["apple", "river", "guitar", "mountain", "coffee", "violet", "tiger", "marble", "rocket", "lantern"]
N = RECENT + 150  # rows 0..149 are older than the newest RECENT


def _row(user: str, i: int, text: str) -> tuple:
    eid = uuid.uuid5(uuid.NAMESPACE_OID, f"{user}/{i}")
    return (eid, uuid.uuid5(eid, "src"), user, "c1", T0 + timedelta(minutes=i), T0 + timedelta(minutes=i), 0, i,
            text, "", None, np.zeros(384, dtype=np.float32), "test-model")


async def _copy(conn, rows: list[tuple]) -> None:
    await conn.copy_records_to_table("episodes", records=rows, columns=[
        "episode_id", "source_event_id", "user_id", "conversation_id", "occurred_at", "recorded_at",
        "source_partition", "source_offset", "user_message", "assistant_message", "metadata", "embedding",
        "embedding_model"])


def _texts(seed: int) -> list[str]:
    r = random.Random(seed)
    texts = [" ".join(r.sample(COMMON, 3)) for _ in range(N)]
    for i in (3, 40, 77, 120, 149):  # every word of "zeppelin walrus", all outside the window
        texts[i] += " zeppelin walrus"
    for i in (500, 900):  # one of them, inside the window
        texts[i] += " zeppelin"
    texts[10] += " quokka"  # a word found only outside the window
    return texts


async def _lexemes(conn, text: str) -> set[str]:
    return set(await conn.fetchval("SELECT coalesce(array_agg(lexeme), '{}') FROM unnest(to_tsvector('english', $1))", text))


async def _query_words(conn, query: str) -> set[str]:
    """The first MAX_TERMS distinct lexemes of the query, word by word in the order written."""
    words: list[str] = []
    for word in query.split():
        words += [w for w in sorted(await _lexemes(conn, word)) if w not in words]
    return set(words[:MAX_TERMS])


async def _expected(conn, user: str, texts: list[str], query: str, k: int) -> list[tuple[uuid.UUID, float]]:
    words = await _query_words(conn, query)
    rows = [(uuid.uuid5(uuid.NAMESPACE_OID, f"{user}/{i}"), T0 + timedelta(minutes=i), await _lexemes(conn, t))
            for i, t in enumerate(texts)]
    window = sorted(rows, key=lambda r: r[1], reverse=True)[:RECENT]
    idf = {w: math.log(1 + (len(window) - df + 0.5) / (df + 0.5))
           for w in words for df in [sum(w in r[2] for r in window)]}
    every = [r for r in rows if words and words <= r[2]]
    if sum(words <= r[2] for r in window) < k:  # else the SQL skips them: they cannot reach the top k
        assert len(every) < CAP, "the all-words part takes at most CAP rows: keep the test inside it"
    cands = {r[0]: r for r in [r for r in window if words & r[2]] + every}
    scored = [(key, sum(idf[w] for w in words & r[2]), r[1]) for key, r in cands.items()]
    scored.sort(key=lambda s: (-round(s[1], 9), -s[2].timestamp(), str(s[0])))
    return [(key, round(score, 6)) for key, score, _ in scored[:k]]


@pytest.mark.parametrize("plans", ["force_custom_plan", "force_generic_plan"])  # the reader uses the generic one
@pytest.mark.parametrize("query", [
    "zeppelin walrus",        # every word only in old rows: found through the all-words part, first
    "apple",                  # one common word: the window holds k rows with it, the all-words scan is skipped
    "apple river tiger",      # several common words
    "quokka",                 # a word only outside the window: still found (it is every word of the query)
    "tiger xylophone",        # a word nobody used: the all-words part finds nothing
    "xylophone",              # nothing at all
    "the and of",             # stop words only: no words, no scan
    # a pasted page: only its first MAX_TERMS words are searched, so zeppelin is and apple is not
    " ".join(["zeppelin"] + [f"filler{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(60)] + ["apple"]),
])
async def test_keyword_sql_returns_what_its_contract_says(conn, query, plans):
    await conn.execute(f"SET plan_cache_mode = {plans}")
    texts = _texts(seed=11)
    await _copy(conn, [_row("kw", i, t) for i, t in enumerate(texts)])
    # Another user with the same words (and more of the rare ones) never leaks in.
    other = [t + " zeppelin walrus quokka" for t in _texts(seed=12)[:300]]
    await _copy(conn, [_row("other", i, t) for i, t in enumerate(other)])
    got = [(r["episode_id"], round(float(r["rank"]), 6)) for r in await episodes_q.keyword(conn, "kw", query, 20)]
    assert got == await _expected(conn, "kw", texts, query, 20)
    if query == "zeppelin walrus":
        assert [i for i, _ in got[:5]] == [uuid.uuid5(uuid.NAMESPACE_OID, f"kw/{i}") for i in (149, 120, 77, 40, 3)]
    if query == "quokka":
        assert [i for i, _ in got] == [uuid.uuid5(uuid.NAMESPACE_OID, "kw/10")]
    if query.startswith("zeppelin filler"):  # the first MAX_TERMS words (32) hold no apple
        assert [i for i, _ in got] == [uuid.uuid5(uuid.NAMESPACE_OID, f"kw/{i}") for i in (900, 500)]


async def test_a_huge_word_of_the_longest_user_id_is_stored_and_left_out_of_the_postings(conn):
    # The longest user id (256 characters) and a 2 kB word, neither compressible: as one btree key
    # (2,784 bytes) they exceed the 2,704-byte limit and the insert would fail.
    r = random.Random(3)
    user = "".join(chr(r.randint(0x4E00, 0x9FFF)) for _ in range(256))
    word = "".join(r.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=2000))
    await _copy(conn, [_row(user, 0, f"{word} apple")])
    assert await conn.fetchval("SELECT array_agg(term) FROM episodes_terms WHERE user_id = $1", user) == ["appl"]
    found = await episodes_q.keyword(conn, user, "apple", 5)
    assert [r["episode_id"] for r in found] == [uuid.uuid5(uuid.NAMESPACE_OID, f"{user}/0")]
