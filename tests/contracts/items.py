"""Realistic input items for the contract suites: decisions and commands about successive turns
of one events log, ids derived from each turn's event id as formation derives them."""
from __future__ import annotations

import itertools
import math
import uuid
from datetime import datetime, timedelta, timezone

import numpy as np

from memstream.embedding import to_bytes
from memstream.schemas import (SYSTEM_USER, ReflectionRecorded, AliasAdded, EdgeClosed, EdgeOpened, EntityCreated, EpisodeRecorded, Passage,
                               ExpertIdentityDeleted, ExpertIdentityUpserted, FactAdded, FactChangeDeferred, FactRefused,
                               FactArchived, FactDeleted, FactReinforced, FactRestored, FactUpdated, LogPosition,
                               MemoriesUsed, PersonIdentitySet, ReminderResolved, ReminderScheduled)
from memstream.schemas.events import new_event_id

T0 = datetime(2026, 3, 1, 9, tzinfo=timezone.utc)
DIM = 384
MODEL = "contract-model"
EVENTS = "contract.events"
_turns = itertools.count()


def toward(similarity: float, axis: int = 1) -> np.ndarray:
    """A unit vector whose cosine with ``QUERY`` is ``similarity`` (the rest lies along ``axis``)."""
    v = np.zeros(DIM, dtype=np.float32)
    v[0], v[axis] = similarity, math.sqrt(max(0.0, 1.0 - similarity ** 2))
    return v


QUERY = toward(1.0)


def _turn(user: str, role: str) -> dict:
    n = next(_turns)
    ev = new_event_id()
    return dict(decision_id=uuid.uuid5(ev, role), source_event_id=ev, source=LogPosition(EVENTS, 0, n),
                recorded_at=T0 + timedelta(minutes=n), user_id=user)


def episode(user: str, text: str, conversation: str = "c1", passages: int = 0) -> EpisodeRecorded:
    """A turn's episode; with ``passages``, that many later windows of its text, each a third of it."""
    c = _turn(user, "episode")
    third = max(1, len(text) // 3)
    return EpisodeRecorded(**c, conversation_id=conversation, occurred_at=c["recorded_at"], user_message=text,
                           assistant_message="Noted.", metadata={"channel": "web"}, embedding=to_bytes(toward(0.5)),
                           embedding_model=MODEL,
                           passages=[Passage(start=n * third, end=(n + 1) * third, embedding=to_bytes(toward(0.4)))
                                     for n in range(1, passages + 1)])


# float32-exact confidences: rows read back from Postgres (real) compare equal to the core's.
_FACT = dict(extractor="contract-extractor", resolver="contract-resolver", confidence=0.75, explicit=True)


def _body(c: dict, attribute: str, value: str, similarity: float, model: str, category: str) -> dict:
    return dict(fact_id=c["decision_id"], text=f"{attribute}: {value}", category=category, attribute=attribute,
                value=value, valid_from=c["recorded_at"] - timedelta(days=1),
                embedding=to_bytes(toward(similarity)), embedding_model=model)


def added(user: str = "ana", attribute: str = "likes", value: str = "jazz", *, similarity: float = 0.9,
          model: str = MODEL, category: str = "preference") -> FactAdded:
    c = _turn(user, "fact:0")
    return FactAdded(**c, **_FACT, reason="new fact", **_body(c, attribute, value, similarity, model, category))


def updated(old: FactAdded | FactUpdated, value: str, *, similarity: float = 0.9) -> FactUpdated:
    c = _turn(old.user_id, "fact:0")
    return FactUpdated(**c, **_FACT, reason="updated", supersedes=old.fact_id,
                       **_body(c, old.attribute, value, similarity, old.embedding_model, old.category))


def deleted(old: FactAdded | FactUpdated) -> FactDeleted:
    c = _turn(old.user_id, "fact:0")
    return FactDeleted(**c, **_FACT, reason="retracted", target=old.fact_id, valid_to=c["recorded_at"])


def reinforced(old: FactAdded | FactUpdated) -> FactReinforced:
    return FactReinforced(**_turn(old.user_id, "fact:0"), **_FACT, reason="observed again", target=old.fact_id)


def deferred(old: FactAdded | FactUpdated, value: str) -> FactChangeDeferred:
    return FactChangeDeferred(**_turn(old.user_id, "fact:0"), **{**_FACT, "explicit": False}, reason="safety gate",
                              target=old.fact_id, operation="UPDATE", value=value, text=f"{old.attribute}: {value}")


def archived(old: FactAdded | FactUpdated, sweep_id: uuid.UUID = uuid.UUID(int=7)) -> FactArchived:
    c = _turn(old.user_id, "archived:0")
    return FactArchived(**c, **_FACT, reason="decayed", target=old.fact_id, sweep_id=sweep_id, strength=0.1)


def restored(old: FactAdded | FactUpdated) -> FactRestored:
    return FactRestored(**_turn(old.user_id, "fact:0"), **_FACT, reason="said again", target=old.fact_id)


def reflected(sources: list[FactAdded], turns: list[uuid.UUID], user: str = "ana") -> ReflectionRecorded:
    c = _turn(user, "reflection:0")
    return ReflectionRecorded(**c, **_FACT, reason="reflection sweep", sources=[f.fact_id for f in sources],
                              turns=list(turns), sweep_id=uuid.UUID(int=9), prompt_version="contract",
                              **_body(c, "reflection", "a theme", 0.5, MODEL, "reflection"))


def refused(user: str = "ana", value: str = "Oslo", kind: str = "other_person") -> FactRefused:
    return FactRefused(**_turn(user, "refused:0"), **_FACT, reason="about someone else", text=f"Lives in {value}",
                       category="location", attribute="home", value=value, refusal=kind,
                       evidence=f"My brother lives in {value}")


_GRAPH = dict(extractor="contract-extractor", reason="said so")


def entity(user: str, name: str, *, is_user: bool = False) -> EntityCreated:
    c = _turn(user, f"entity:{name}")
    return EntityCreated(**c, **_GRAPH, entity_id=c["decision_id"], name=name, is_user=is_user)


def alias(of: EntityCreated, name: str) -> AliasAdded:
    return AliasAdded(**_turn(of.user_id, f"alias:{name}"), **_GRAPH, entity_id=of.entity_id, alias=name)


def edge(source: EntityCreated, relation: str, *, target: EntityCreated | None = None, value: str | None = None,
         multi_valued: bool = False, days: int = 0, target_entity_id: uuid.UUID | None = None) -> EdgeOpened:
    c = _turn(source.user_id, f"edge:{relation}")
    named = target.name if target is not None else value or "someone"
    return EdgeOpened(**c, **_GRAPH, edge_id=c["decision_id"], source_entity_id=source.entity_id, relation=relation,
                      target_entity_id=target.entity_id if target is not None else target_entity_id,
                      target_value=value, multi_valued=multi_valued, valid_from=T0 + timedelta(days=days),
                      fact_sentence=f"{source.name} {relation} {named}", confidence=0.75, explicit=True,
                      embedding=to_bytes(toward(0.5)), embedding_model=MODEL)


def closed(e: EdgeOpened, *, days: int) -> EdgeClosed:
    return EdgeClosed(**_turn(e.user_id, "edge-closed"), **_GRAPH, edge_id=e.edge_id,
                      valid_to=T0 + timedelta(days=days))


def _at() -> datetime:
    return T0 + timedelta(minutes=next(_turns))


def scheduled(user: str, text: str) -> ReminderScheduled:
    return ReminderScheduled.new(user_id=user, text=text, due_at=T0 + timedelta(days=7), occurred_at=_at())


def resolved(r: ReminderScheduled, status: str = "done") -> ReminderResolved:
    return ReminderResolved(event_id=new_event_id(), user_id=r.user_id, occurred_at=_at(), reminder_id=r.reminder_id,
                            status=status)


def identity(user: str, **attributes) -> PersonIdentitySet:
    return PersonIdentitySet(event_id=new_event_id(), user_id=user, occurred_at=_at(), attributes=attributes)


def expert(identity_id: str, name: str) -> ExpertIdentityUpserted:
    return ExpertIdentityUpserted(event_id=new_event_id(), user_id=SYSTEM_USER, occurred_at=_at(),
                                  identity_id=identity_id, name=name, instructions=f"Answer as {name}.",
                                  attributes={"tone": "warm"})


def expert_gone(identity_id: str) -> ExpertIdentityDeleted:
    return ExpertIdentityDeleted(event_id=new_event_id(), user_id=SYSTEM_USER, occurred_at=_at(),
                                 identity_id=identity_id)


def used(user: str, *fact_ids: uuid.UUID, episodes: list[uuid.UUID] = ()) -> MemoriesUsed:
    return MemoriesUsed(event_id=new_event_id(), user_id=user, occurred_at=_at(), fact_ids=list(fact_ids),
                        episode_ids=list(episodes))
