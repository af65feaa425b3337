"""Requests about a user's memory (``CONTROL_TYPES``: corrections and forgets), decided in their
place in the log like turns, and the key a whole user's forget ends.

A request names what it is about by id and, when it can, by what it says: re-formed with
another extractor, a fact or edge may have another id, and the request still finds it by its
slot and value (or relation and ends). Naming what its user does not hold, it is refused
(``RequestRefused``: dead-lettered, nothing changes). What a forget takes goes with what states
it the other way (one truth: a fact and the user's edge of its slot)."""
from __future__ import annotations

import logging
import uuid
from typing import Sequence

from memstream.projections.facts import core as facts_core
from memstream.schemas import (DecaySwept, Decision, EdgeForgotten, EpisodeForgotten, Event, FactCorrected,
                               FactForgotten, FactUpdated, LogPosition, MemoryForgotten, ReflectRequested,
                               UserForgotten)
from memstream.schemas.errors import Refused
from memstream.schemas.vocabulary import attributes_of, relation_of
from memstream.embedding import to_bytes
from memstream.projections.graph.core import EdgeRow, EntityRow
from memstream.streams.log.records import Record
from memstream.streams.log.sealing import RecordSealer
from memstream.streams.worker.formation import slot_edges
from memstream.streams.worker.formation.graph import GraphView
from memstream.streams.worker.formation.turn import TurnDecider
from memstream.streams.worker.formation.reflections import nothing_remembered, reflections, remembered_in
from memstream.streams.worker.formation.views import FactView
from memstream.streams.worker.sweeping import archivals, moved

log = logging.getLogger("memstream.formation")
# What a forget may name: a fact believed now, in the read path or archived out of it.
_HELD = ("current", "archived")


class RequestRefused(Refused):
    """A request names a fact or edge its user does not hold (current): dead-lettered, nothing changes."""

    users_input = True


class ControlRequests:
    """What a request makes, decided on the user's views as a turn is."""

    def __init__(self, turns: TurnDecider, sealer: RecordSealer, reflector=None, episodes=None):
        """``episodes``: the pool the episodes projection is read on (a reflection's turns),
        ``turns.pool`` if None."""
        from memstream.llm.offline_reflection import OfflineReflector

        self._turns, self._sealer, self._reflector = turns, sealer, reflector or OfflineReflector()
        episodes = episodes or turns.pool
        read = nothing_remembered if episodes is None else remembered_in(episodes)

        async def remembered(user_id, turn_ids):
            # A turn forgotten before the request, in this batch or before: the episodes
            # projection may not have applied its forget yet.
            return await read(user_id, [t for t in turn_ids if not await turns.forgotten(user_id, t)])
        self._remembered = remembered

    async def decide(self, r: Record, e: Event, overlay: FactView, graph: GraphView) -> list[Decision]:
        """The decisions a request about ``e.user_id``'s memory makes."""
        common = dict(source_event_id=e.event_id, source=LogPosition(r.topic, r.partition, r.offset),
                      recorded_at=r.timestamp, user_id=e.user_id)
        why = f" by {e.actor}" + (f": {e.reason}" if e.reason else "")
        if isinstance(e, FactCorrected):
            old = await current_fact(overlay, e.user_id, e.fact_id, e)
            text = e.text or (old.text.replace(old.value, e.value) if old.value and old.value in old.text
                              else f"{old.text}: {e.value}")
            fid = uuid.uuid5(e.event_id, "fact:0")
            [vector] = await self._turns.embed_facts([text])
            # Explicit and the user's own word: it passes the safety gate by construction. A
            # correction says the old value was never true, not that it stopped being true: the
            # new version holds from the old one's start, which ends where it began (system
            # time still shows what was believed until the correction).
            updated = FactUpdated(**common, decision_id=fid, said_at=e.occurred_at, extractor=f"control:{e.actor}",
                                  resolver=f"control:{e.actor}", confidence=1.0, explicit=True, fact_id=fid, text=text,
                                  category=old.category, attribute=old.attribute, value=e.value,
                                  valid_from=old.valid_from, embedding=to_bytes(vector),
                                  embedding_model=self._turns.embedder.model_id, supersedes=old.fact_id,
                                  reason=f"corrected{why}")
            overlay.apply(updated)
            # The edge stating the same slot is corrected in the same step: one truth.
            relations = {relation_of(old.attribute)} - {None}
            return [updated, *await self._turns.follow(r, e, overlay, graph, relations, extractor=f"control:{e.actor}",
                                                 why=f"corrected{why}")]
        forget = dict(**common, actor=e.actor, reason=e.reason)
        if isinstance(e, FactForgotten):
            await overlay.ensure(e.user_id, [e.fact_id])
            row = overlay.rows.get((e.user_id, e.fact_id))

            def named(f) -> bool:  # the slot and value the request names, when it names them
                return e.attribute is None or (f.attribute == e.attribute
                                               and (e.value or "").casefold() == f.value.casefold())

            if row is not None and row.status in _HELD and named(row):
                targets = [row.fact_id]
            else:
                # Re-formed with another extractor, the fact may have another id, and its id be
                # another fact's: the same slot and value.
                targets = sorted(f.fact_id for f in overlay.rows.values() if f.user_id == e.user_id
                                 and f.status in _HELD and e.attribute is not None and named(f))
                if not targets:
                    raise RequestRefused(f"FactForgotten names {e.fact_id}, not a current fact of this user")
            # Earlier versions of the fact saying the same value go too (a correction that kept the
            # value, a slot said again): the value, not one version of it, is what is forgotten.
            for t in list(targets):
                f = overlay.rows[e.user_id, t]
                targets += [v.fact_id for v in await overlay.slot(e.user_id, [f.attribute])
                            if v.lineage_id == f.lineage_id and v.fact_id not in targets and v.status != "forgotten"
                            and v.value.casefold() == f.value.casefold()]
            made: list[Decision] = [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, f"forgotten:{n}"),
                                                    kind="fact", target=t) for n, t in enumerate(targets)]
            rows = [overlay.rows[e.user_id, t] for t in targets]
            for d in made:
                overlay.apply(d)
            # The edges stating it go with it, and so do the turns it was read from (their other
            # facts and edges stay, noted), unless the caller keeps them.
            made += await self._turns.follow(r, e, overlay, graph, {relation_of(f.attribute) for f in rows} - {None},
                                       extractor=f"control:{e.actor}", why=f"forgotten{why}",
                                       forgot=(e.actor, e.reason, [f.value for f in rows]))
            if not e.keep_episodes:
                # A reflection was read from no turn (its source event is the sweep's request): the
                # facts and turns it was drawn from stay.
                turns = list(dict.fromkeys(t for f in rows if f.category != facts_core.REFLECTION
                                           for t in (f.source_event_id, *f.observed_in)))
                self._turns.forgot_turns(e.user_id, turns)
                await overlay.ensure(e.user_id, [], turns)  # the reflections drawn from them go with them
                made += [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, f"forgotten-turn:{n}"),
                                         kind="episode", target=t, keep_derived=True) for n, t in enumerate(turns)]
            return made
        if isinstance(e, EdgeForgotten):
            await graph.ensure_user(e.user_id)
            edge = graph.rows.get((e.user_id, e.edge_id))
            if isinstance(edge, EdgeRow) and says(graph, edge, e):
                targets = [e.edge_id]
            else:  # re-formed with another extractor: the same relation between the same ends
                targets = sorted(x.edge_id for x in graph.of(e.user_id).values() if isinstance(x, EdgeRow)
                                 and not x.forgotten and e.relation is not None
                                 and says(graph, x, e))
                if not targets:
                    raise RequestRefused(f"EdgeForgotten names {e.edge_id}, not an edge of this user")
            made = [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, "forgotten" if n == 0 else
                                                                     f"forgotten:{n}"), kind="edge", target=t)
                    for n, t in enumerate(targets)]
            # The facts stating the same relationship of the user go with it, and any other edge
            # of theirs: one truth.
            for d in made:
                graph.apply(d)
            said = await facts_of_edges(overlay, graph, e.user_id, targets)
            made += [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, f"forgotten-fact:{n}"),
                                     kind="fact", target=f.fact_id) for n, f in enumerate(said)]
            for d in made[len(targets):]:
                overlay.apply(d)
            return made + await self._turns.follow(r, e, overlay, graph, {relation_of(f.attribute) for f in said} - {None},
                                             extractor=f"control:{e.actor}", why=f"forgotten{why}",
                                             forgot=(e.actor, e.reason, [f.value for f in said]))
        if isinstance(e, EpisodeForgotten):
            self._turns.forgot_turns(e.user_id, [e.turn_event_id])
            # The turn goes; what it alone said goes with it, decided here one by one rather than
            # by the projections' episode rule (``keep_derived``): a fact another turn said again
            # stays, noted, and so does the user's edge stating it — one truth.
            await overlay.ensure(e.user_id, facts_core.turn_decisions(e.turn_event_id), [e.turn_event_id])
            await graph.ensure_user(e.user_id)
            user = slot_edges.user_entity_id(e.user_id)
            alone = [f for fid in facts_core.turn_decisions(e.turn_event_id)
                     if (f := overlay.rows.get((e.user_id, fid))) is not None and f.status != "forgotten"
                     and f.source_event_id == e.turn_event_id and f.observation_count == 1]
            edges = sorted((x for x in graph.of(e.user_id).values() if isinstance(x, EdgeRow) and not x.forgotten
                            and x.source_event_id == e.turn_event_id), key=lambda x: x.edge_id)
            slots = {x.relation for x in edges if x.source_entity_id == user and attributes_of(x.relation)}
            made: list[Decision] = [
                MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, "forgotten"), kind="episode",
                                target=e.turn_event_id, keep_derived=True),
                *(MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, f"forgotten-fact:{n}"), kind="fact",
                                  target=f.fact_id) for n, f in enumerate(alone)),
                *(MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, f"forgotten-edge:{n}"), kind="edge",
                                  target=x.edge_id)
                  for n, x in enumerate(x for x in edges if not (x.source_entity_id == user and x.relation in slots)))]
            for d in made:
                overlay.apply(d)
                graph.apply(d)
            relations = ({relation_of(f.attribute) for f in alone} | slots) - {None}
            return made + await self._turns.follow(r, e, overlay, graph, relations, extractor=f"control:{e.actor}",
                                             why=f"forgotten{why}", forgot=(e.actor, e.reason, [f.value for f in alone]))
        if isinstance(e, DecaySwept):
            await overlay.ensure(e.user_id, [f.fact_id for f in e.facts])
            return archivals(e, overlay.rows, common) + moved(e, common)
        if isinstance(e, ReflectRequested):
            return await reflections(e, overlay, self._reflector, self._turns.ask, self._turns.embed_facts,
                                     self._turns.embedder.model_id, common, self._remembered)
        if isinstance(e, UserForgotten):
            self._turns.forget_user(e.user_id)
            return [MemoryForgotten(**forget, decision_id=uuid.uuid5(e.event_id, "forgotten"), kind="user",
                                    generation=await self._sealer.stamp(e))]
        return []


async def end_keys(sealer: RecordSealer, decisions: Sequence[tuple[Record, Decision]]) -> None:
    """Destroy the data key of each user a decision forgets whole: called once every decision
    before the forget is sealed and sent (what was sealed with the key is noise from here on)."""
    for _, d in decisions:
        if isinstance(d, MemoryForgotten) and d.kind == "user":
            await sealer.destroy(d.user_id, d.generation)


async def facts_of_edges(overlay: FactView, graph: GraphView, user_id: str, edge_ids) -> list:
    """The user's fact versions (not forgotten) of the slot and value these edges of the user
    state, believed while the edge was."""
    user, out = slot_edges.user_entity_id(user_id), {}
    for edge_id in edge_ids:
        edge = graph.rows.get((user_id, edge_id))
        if not isinstance(edge, EdgeRow) or edge.source_entity_id != user:
            continue
        names = slot_edges.target_names(graph, edge)
        out.update((f.fact_id, f) for f in await overlay.slot(user_id, attributes_of(edge.relation))
                   if f.status != "forgotten" and f.value.casefold() in names and slot_edges.overlap(f, edge))
    return list(out.values())


async def current_fact(overlay: FactView, user_id: str, fact_id: uuid.UUID, e: Event):
    await overlay.ensure(user_id, [fact_id])
    row = overlay.rows.get((user_id, fact_id))
    if row is None or row.status not in _HELD:  # an archived fact is corrected as a current one
        raise RequestRefused(f"{type(e).__name__} names {fact_id}, not a current fact of this user")
    return row


def says(graph: GraphView, edge: EdgeRow, forget: EdgeForgotten) -> bool:
    """Whether ``edge`` is the relationship ``forget`` names, by what it says (when it says)."""
    if forget.relation is None:
        return True

    def named(entity_id, value, name) -> bool:  # an entity by its name or an alias, else the value
        entity = graph.rows.get((edge.user_id, entity_id)) if entity_id is not None else None
        said = (name or "").casefold()
        return said in entity.names() if isinstance(entity, EntityRow) else said == (value or "").casefold()

    return (edge.relation == forget.relation and named(edge.source_entity_id, None, forget.source)
            and named(edge.target_entity_id, edge.target_value, forget.target))

