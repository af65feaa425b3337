"""What a reflection request (``ReflectRequested``) makes, in its place among the user's turns:
for each cluster the sweep found whose facts are still current and turns still remembered (two
memories or more all told; a fact or more, unless the sweep found turns alone with a topic), and
not reflected on already (or joined by a memory since: the new reflection replaces the old), one
sentence from the reflection model, recorded as ``ReflectionRecorded`` when its sources support
it, else as a ``FactRefused`` (``ungrounded``) saying why.

Grounding a reflection as the junk guard grounds a fact: by reading its sources, never the
model's word for them. The sentence must cite at least two of the memories it was shown (one of
its facts, if it was shown any), name no one and no number its cited memories do not, and say
mostly what they say (``ungrounded``)."""
from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Awaitable, Callable, Mapping, Sequence

from memstream.embedding import to_bytes
from memstream.llm.protocols import ModelRefused, Reflection, ReflectionClient, Unanswered
from memstream.projections.episodes import query as episodes_q
from memstream.projections.facts.core import HELD, REFLECTION, FactRow
from memstream.schemas import Decision, FactRefused, ReflectRequested, ReflectionRecorded
from memstream.streams.worker.formation.views import FactView

log = logging.getLogger("memstream.formation")

ATTEMPTS = 3  # a cluster the model gives no usable answer for this often is left for the next sweep
MAX_VALUE_CHARS = 100  # the value column is a btree key (the slot index)
# A paraphrase may use words its sources do not ("most weekends" for "on Saturdays"), but most of
# what it says must be theirs.
MAX_NEW_WORDS = 0.5
# Sweeps whose clusters of turns alone were not held to a topic (streams.worker.reflecting): a
# reform forming their requests again draws none of those.
UNTESTED_TURNS = frozenset({"reflect-v1", "reflect-v2"})
# The user's own words stand as they said them: as sure as a fact can be.
TURN_CONFIDENCE = 1.0
# A turn's words shown to the model: a pasted document would crowd out the rest of the cluster.
MAX_TURN_CHARS = 1000

_WORD = re.compile(r"[^\W\d_]+|\d+(?:[.,]\d+)?", re.UNICODE)
_COMMON = frozenset(
    "a an the and or but of in on at to for from with by as is are was were be been being has have had do does did "
    "their they them they're user users who whom which that this these those it its very often usually regularly "
    "keeps keep coming back one theme themes pattern habit habits interest interests several many most much more "
    "also both all some any each every there here over about into across around between".split())


@dataclass(frozen=True)
class Turn:
    """A turn a reflection may rest on: its event id and what the user said in it."""

    turn_id: uuid.UUID
    text: str
    occurred_at: datetime
    recorded_at: datetime


# The user's turns (event ids) still remembered, of those asked for: the episodes projection's.
Remembered = Callable[[str, Sequence[uuid.UUID]], Awaitable[Mapping[uuid.UUID, Turn]]]


async def nothing_remembered(user_id: str, turns: Sequence[uuid.UUID]) -> Mapping[uuid.UUID, Turn]:
    return {}


def remembered_in(pool) -> Remembered:
    """``Remembered`` read from the episodes projection on ``pool``: a turn forgotten since the
    sweep is not there."""
    async def remembered(user_id: str, turns: Sequence[uuid.UUID]) -> Mapping[uuid.UUID, Turn]:
        async with pool.acquire() as conn:
            rows = await episodes_q.by_source(conn, user_id, turns)
        return {t: Turn(t, r["user_message"], r["occurred_at"], r["recorded_at"]) for t, r in rows.items()}
    return remembered


def ungrounded(text: str, sources: Sequence[str]) -> str | None:
    """Why ``text`` goes beyond ``sources`` (the texts of the facts it cites), or None."""
    said = {_stem(w) for s in sources for w in _WORD.findall(s)}
    words = _WORD.findall(text)
    for i, w in enumerate(words):
        if w[0].isdigit() and w not in {x for s in sources for x in _WORD.findall(s)}:
            return f"it states a number ({w}) none of its sources does"
        # Not the first word: capitalised whatever it is, and a name there ("Maria likes...")
        # cannot be told from a generalisation ("Health is a priority...") without a lexicon.
        if i > 0 and w[0].isupper() and _stem(w) not in said:
            return "it names someone or something none of its sources does"
    content = [w for w in words if w.casefold() not in _COMMON and not w[0].isdigit()]
    new = [w for w in content if _stem(w) not in said]
    if content and len(new) > MAX_NEW_WORDS * len(content):
        return f"{len(new)} of its {len(content)} words are in none of its sources"
    return None


def _stem(word: str) -> str:
    return word.casefold()[:5]  # "running" and "runs" differ; "marathons" and "marathon" do not


async def reflections(request: ReflectRequested, overlay: FactView, reflector: ReflectionClient,
                      ask: Callable[..., Awaitable[Reflection]], embed: Callable[[list[str]], Awaitable[list]],
                      embedding_model: str, common: dict, remembered: Remembered = nothing_remembered
                      ) -> list[Decision]:
    """The decisions ``request`` makes (applied to ``overlay`` as they are made). ``ask`` calls
    the model (formation's slots), ``embed`` embeds texts as facts are, ``remembered`` reads the
    clusters' turns; ``common`` is the decisions' envelope (source event, position, time, user)."""
    out: list[Decision] = []
    user = request.user_id
    for n, cluster in enumerate(request.clusters):
        await overlay.ensure(user, cluster.sources, cluster.turns)
        facts = [r for fid in cluster.sources if (r := overlay.rows.get((user, fid))) is not None
                 and r.current and r.category != REFLECTION]
        held = await remembered(user, cluster.turns) if cluster.turns else {}
        turns = [held[t] for t in cluster.turns if t in held]
        if (cluster.sources and not facts) or len(facts) + len(turns) < 2:
            continue  # its facts ended or changed, or its turns were forgotten, since the sweep
        if not cluster.sources and request.policy in UNTESTED_TURNS:
            continue  # turns alone, of a sweep that did not ask them for a topic
        drawn = _drawn(overlay, user, {r.fact_id for r in facts}, {t.turn_id for t in turns})
        held = [x for x in drawn if x.current]  # one archived since is drawn again, and replaced
        if held and all(at <= max(x.recorded_at for x in held)
                        for at in [*(r.recorded_at for r in facts), *(t.recorded_at for t in turns)]):
            continue  # reflected on already, and no memory joined the cluster since
        texts = [r.text for r in facts] + [t.text[:MAX_TURN_CHARS] for t in turns]
        answer = await _asked(ask, reflector, texts)
        if answer is None:
            continue
        cited = list(answer.cited)
        cited_facts = [facts[i] for i in cited if i < len(facts)]
        cited_turns = [turns[i - len(facts)] for i in cited if i >= len(facts)]
        did = uuid.uuid5(request.event_id, f"reflection:{n}")
        sure = [r.confidence for r in cited_facts] + [TURN_CONFIDENCE for _ in cited_turns]
        envelope = dict(**common, decision_id=did, extractor=reflector.model_id, resolver=f"control:{request.actor}",
                        confidence=round(min(sure), 4) if sure else 0.0, explicit=False)
        why = ("it cites fewer than two of its memories" if len(cited) < 2
               else "it cites none of its facts" if facts and not cited_facts
               else ungrounded(answer.text, [texts[i] for i in cited]))
        if why is not None:
            # Without its sentence: it may say what a source said, and nothing forgets a refusal
            # when a source is forgotten.
            out.append(FactRefused(**envelope, reason=f"reflection refused: {why}", text="",
                                   category=REFLECTION, attribute=REFLECTION, value="", refusal="ungrounded"))
            continue
        [vector] = await embed([answer.text])
        observed = sum(r.observation_count for r in cited_facts) + len(cited_turns)
        made = ReflectionRecorded(
            **envelope, reason=f"reflection sweep {request.sweep_id}: drawn from {len(cited_facts)} facts and "
                               f"{len(cited_turns)} turns said {observed} times", fact_id=did, text=answer.text,
            category=REFLECTION, attribute=REFLECTION, value=answer.text[:MAX_VALUE_CHARS],
            valid_from=max([r.valid_from for r in cited_facts] + [t.occurred_at for t in cited_turns]),
            embedding=to_bytes(vector), embedding_model=embedding_model, sources=[r.fact_id for r in cited_facts],
            turns=[t.turn_id for t in cited_turns], sweep_id=request.sweep_id,
            prompt_version=reflector.prompt_version, replaces=sorted(x.fact_id for x in drawn))
        overlay.apply(made)
        out.append(made)
    return out


def _drawn(overlay: FactView, user: str, sources: set[uuid.UUID], turns: set[uuid.UUID]) -> list[FactRow]:
    """The user's reflections still believed drawn from some of ``sources`` and ``turns`` only
    (the overlay holds those drawn from any fact or turn it was asked to ensure)."""
    return [r for r in list(overlay.rows.values()) if r.user_id == user and r.category == REFLECTION
            and r.status in HELD and set(r.derived_from) <= sources and set(r.derived_from_turns) <= turns]


async def _asked(ask, reflector: ReflectionClient, texts: list[str]) -> Reflection | None:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await ask(reflector.reflect, texts)
        except Unanswered as exc:
            log.warning("reflection model gave no usable answer (attempt %d of %d): %s", attempt, ATTEMPTS, exc)
        except ModelRefused as exc:
            log.warning("reflection model refused a cluster: %s", exc)
            return None
    return None
