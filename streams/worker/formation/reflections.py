"""What a reflection request (``ReflectRequested``) makes, in its place among the user's turns:
for each cluster the sweep found whose sources are still current and not reflected on already
(or joined by a fact since: the new reflection replaces the old), one sentence from the
reflection model, recorded as ``ReflectionRecorded`` when its sources
support it, else as a ``FactRefused`` (``ungrounded``) saying why.

Grounding a reflection as the junk guard grounds a fact: by reading its sources, never the
model's word for them. The sentence must cite at least two of the facts it was shown, name no one
and no number its cited facts do not, and say mostly what they say (``ungrounded``)."""
from __future__ import annotations

import logging
import re
import uuid
from typing import Awaitable, Callable, Sequence

from memstream.embedding import to_bytes
from memstream.llm.protocols import ModelRefused, Reflection, ReflectionClient, Unanswered
from memstream.projections.facts.core import HELD, REFLECTION, FactRow
from memstream.schemas import Decision, FactRefused, ReflectRequested, ReflectionRecorded
from memstream.streams.worker.formation.views import FactView

log = logging.getLogger("memstream.formation")

ATTEMPTS = 3  # a cluster the model gives no usable answer for this often is left for the next sweep
MAX_VALUE_CHARS = 100  # the value column is a btree key (the slot index)
# A paraphrase may use words its sources do not ("most weekends" for "on Saturdays"), but most of
# what it says must be theirs.
MAX_NEW_WORDS = 0.5

_WORD = re.compile(r"[^\W\d_]+|\d+(?:[.,]\d+)?", re.UNICODE)
_COMMON = frozenset(
    "a an the and or but of in on at to for from with by as is are was were be been being has have had do does did "
    "their they them they're user users who whom which that this these those it its very often usually regularly "
    "keeps keep coming back one theme themes pattern habit habits interest interests several many most much more "
    "also both all some any each every there here over about into across around between".split())


def ungrounded(text: str, sources: Sequence[str]) -> str | None:
    """Why ``text`` goes beyond ``sources`` (the texts of the facts it cites), or None."""
    said = {_stem(w) for s in sources for w in _WORD.findall(s)}
    words = _WORD.findall(text)
    for i, w in enumerate(words):
        if w[0].isdigit() and w not in {x for s in sources for x in _WORD.findall(s)}:
            return f"it states a number ({w}) none of its sources does"
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
                      embedding_model: str, common: dict) -> list[Decision]:
    """The decisions ``request`` makes (applied to ``overlay`` as they are made). ``ask`` calls
    the model (formation's slots), ``embed`` embeds texts as facts are; ``common`` is the
    decisions' envelope (source event, position, time, user)."""
    out: list[Decision] = []
    user = request.user_id
    for n, cluster in enumerate(request.clusters):
        await overlay.ensure(user, cluster.sources)
        live = [r for fid in cluster.sources if (r := overlay.rows.get((user, fid))) is not None
                and r.current and r.category != REFLECTION]
        if len(live) < 2:
            continue  # its facts ended or changed since the sweep
        drawn = _drawn(overlay, user, {r.fact_id for r in live})
        if drawn and all(r.recorded_at <= max(x.recorded_at for x in drawn) for r in live):
            continue  # reflected on already, and no fact joined the cluster since
        answer = await _asked(ask, reflector, live)
        if answer is None:
            continue
        cited = [live[i] for i in answer.cited]
        did = uuid.uuid5(request.event_id, f"reflection:{n}")
        envelope = dict(**common, decision_id=did, extractor=reflector.model_id, resolver=f"control:{request.actor}",
                        confidence=round(min(r.confidence for r in cited), 4) if cited else 0.0, explicit=False)
        why = ("it cites fewer than two of its facts" if len(cited) < 2
               else ungrounded(answer.text, [r.text for r in cited]))
        if why is not None:
            # Without its sentence: it may say what a source said, and nothing forgets a refusal
            # when a source is forgotten.
            out.append(FactRefused(**envelope, reason=f"reflection refused: {why}", text="",
                                   category=REFLECTION, attribute=REFLECTION, value="", refusal="ungrounded"))
            continue
        [vector] = await embed([answer.text])
        observed = sum(r.observation_count for r in cited)
        made = ReflectionRecorded(
            **envelope, reason=f"reflection sweep {request.sweep_id}: drawn from {len(cited)} facts said "
                               f"{observed} times", fact_id=did, text=answer.text, category=REFLECTION,
            attribute=REFLECTION, value=answer.text[:MAX_VALUE_CHARS], valid_from=max(r.valid_from for r in cited),
            embedding=to_bytes(vector), embedding_model=embedding_model, sources=[r.fact_id for r in cited],
            sweep_id=request.sweep_id, prompt_version=reflector.prompt_version,
            replaces=sorted(x.fact_id for x in drawn))
        overlay.apply(made)
        out.append(made)
    return out


def _drawn(overlay: FactView, user: str, sources: set[uuid.UUID]) -> list[FactRow]:
    """The user's reflections still believed drawn from some of ``sources`` only (the overlay
    holds those drawn from any fact it was asked to ensure)."""
    return [r for r in list(overlay.rows.values()) if r.user_id == user and r.category == REFLECTION
            and r.status in HELD and set(r.derived_from) <= sources]


async def _asked(ask, reflector: ReflectionClient, facts: list[FactRow]) -> Reflection | None:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await ask(reflector.reflect, facts)
        except Unanswered as exc:
            log.warning("reflection model gave no usable answer (attempt %d of %d): %s", attempt, ATTEMPTS, exc)
        except ModelRefused as exc:
            log.warning("reflection model refused a cluster: %s", exc)
            return None
    return None
