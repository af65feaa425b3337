"""What formation asks a model and the shape of its answers, whichever service runs the model:
the prompts, the answers as pydantic models (their JSON Schemas are what a service constrains the
output to: a Bedrock tool's input, an OpenAI-compatible ``json_schema`` response format or tool),
and reading an answer back into the protocols' types."""
from __future__ import annotations

import functools
import json
from datetime import datetime, timezone
from typing import Annotated, Literal, Sequence

from pydantic import AfterValidator, BaseModel, Field, ValidationError, create_model

from memstream.llm.protocols import (CATEGORIES, CandidateFact, ExistingFact, MalformedOutput, Operation,
                                     Resolution)
from memstream.schemas import TurnRecorded
from memstream.schemas.events import in_range
from memstream.schemas.vocabulary import fact_attribute


MAX_SLOT_CHARS = 100
# Bounds on an answer: a constrained decoder (a grammar) stops a model that runs on at these
# instead of at the token limit, and a runaway answer fails here, as malformed.
MAX_TEXT_CHARS = 300
MAX_EVIDENCE_CHARS = 400
MAX_ITEMS = 16


def _world_time(when: datetime | None) -> datetime | None:
    # A model may answer a bare date ("2024-05-01": naive) or a year past what the store holds:
    # a naive time is taken as UTC, one out of range is no time at all (the fact stands undated).
    if when is not None and when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when if when is None or in_range(when) else None


WorldTime = Annotated[datetime | None, AfterValidator(_world_time)]


def validated(answer: type[BaseModel], data, what: str) -> BaseModel:
    """``data`` as ``answer``, or ``MalformedOutput`` naming what does not fit — without the input:
    it is what the model read in the turn (logged, and a dead letter's reason)."""
    try:
        return answer.model_validate(data)
    except ValidationError as exc:
        errors = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_input=False)[:3]]
        raise MalformedOutput(f"{what} does not fit its schema: {errors}") from exc


class FactAnswer(BaseModel):
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="the fact as a short sentence about the user")
    category: Literal[CATEGORIES]  # type: ignore[valid-type]
    # Bounded: attributes and relations are btree keys in the projections (a model's runaway
    # output must fail here, as malformed, not as an index row too large in the store).
    attribute: Annotated[str, AfterValidator(fact_attribute)] = Field(
        min_length=1, max_length=MAX_SLOT_CHARS, description="slot: name, home, origin, employer, role, likes, "
                                                             "dislikes, allergy, diet, age, pet, favourite_<thing>, ...")
    value: str = Field(max_length=MAX_SLOT_CHARS)
    confidence: float = Field(ge=0, le=1)
    explicit: bool = Field(description="true if the user stated it, false if inferred")
    valid_at: WorldTime = Field(None, description="when the fact became true, if the turn says")
    negated: bool = Field(False, description="true if the user says it is no longer true or asks to forget it")
    evidence: str = Field(min_length=1, max_length=MAX_EVIDENCE_CHARS,
                          description="the exact words of the USER's message this fact rests on, copied verbatim")


class FactsAnswer(BaseModel):
    facts: list[FactAnswer] = Field(max_length=MAX_ITEMS)


class ResolutionAnswer(BaseModel):
    operation: Literal["ADD", "UPDATE", "DELETE", "NOOP"]
    target_index: int | None = Field(None, description="index of the existing fact for UPDATE, DELETE or NOOP")
    reason: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


EXTRACT_TOOL = "record_facts"


RESOLVE_TOOL = "classify_fact"


EXTRACT_PROMPT = (
    "You extract durable facts about the USER from one conversation turn: identity, where they live or work, "
    "preferences and dislikes, constraints (allergies, diets), family, pets, plans with dates. Only facts about "
    "the user. Mark explicit=true only for what the user stated; inferred facts get explicit=false and lower "
    "confidence. A date dates only the fact it is said of (a child's birthday sets valid_at of the birthday, not "
    "of the child). An explicit request to forget or delete a memory (\"forget that I live in Lisbon\") is that "
    "fact with negated=true and explicit=true, never a fact to learn. For each fact, evidence is the user's own "
    "words it rests on, copied exactly from the USER line. Questions, requests, hypotheticals, jokes, facts about "
    "other people, and text that instructs or describes the assistant are not facts about the user. "
    "Keep only what will still be true and useful in a later conversation: not moods or feelings of the moment, "
    "not counts and details of one event, not what the user is doing right now. A detail about someone the user "
    "mentions (a child's age, a friend's job, a sister's allergy) is not the user's fact. Most turns hold no "
    "fact at all. Examples (not from this conversation):\n"
    "- \"My brother Tomás works at a bank in Lima.\" -> no fact about the user (the brother's job is his).\n"
    "- \"We were nine at dinner last night and I was exhausted.\" -> no fact: one evening's count and a mood.\n"
    "- \"Could you suggest a hike near Bristol?\" -> no fact: a request.\n"
    "- \"I grew up in Porto but I've lived in Bristol for ten years.\" -> origin=Porto (evidence \"I grew up in "
    "Porto\"), home=Bristol (evidence \"I've lived in Bristol\").\n"
    f"Always answer by calling {EXTRACT_TOOL}; an empty list is fine."
)


RESOLVE_PROMPT = (
    "Decide how a new candidate fact relates to the user's existing facts. ADD if it is new; UPDATE(target) if it "
    "replaces an existing fact's value; DELETE(target) if the user says an existing fact is no longer true or "
    "asks to forget it (a negated candidate deletes the fact it names; if none matches, ADD, and nothing is stored); "
    f"NOOP(target) if it is already known. Always answer by calling {RESOLVE_TOOL}."
)


def render_turn(turn: TurnRecorded) -> str:
    return (f"Turn at {turn.occurred_at.isoformat()}\nUSER: {turn.user_message}\n"
            f"ASSISTANT: {turn.assistant_message}")


def resolution_of(out: ResolutionAnswer, neighbours: Sequence[ExistingFact]) -> Resolution:
    op, index = Operation(out.operation), out.target_index
    if op is Operation.ADD:
        return Resolution(op, None, out.reason)
    if index is None or not 0 <= index < len(neighbours):
        raise MalformedOutput(f"{op.value} needs a target_index in [0, {len(neighbours)}), got {index!r}")
    return Resolution(op, neighbours[index].fact_id, out.reason)


class IndexedResolutionAnswer(ResolutionAnswer):
    candidate_index: int = Field(description="which candidate this classifies")


class ResolutionsAnswer(BaseModel):
    resolutions: list[IndexedResolutionAnswer]


RESOLVE_ALL_TOOL = "classify_facts"


# Bounded answers: a decoder constrained by the schema (llama.cpp's grammar, structured outputs)
# cannot then name a fact it was not shown, or leave UPDATE, DELETE or NOOP without one — a small
# model otherwise does, and each such answer is a call asked again.
_TARGET = "index of the existing fact the operation names (for ADD: the nearest one; it is not used)"


@functools.lru_cache(maxsize=256)
def resolution_answer(shown: int) -> type[ResolutionAnswer]:
    """``ResolutionAnswer`` whose ``target_index`` is required and one of the ``shown`` facts."""
    if shown < 1:
        return ResolutionAnswer
    return create_model(f"ResolutionAnswer{shown}", __base__=ResolutionAnswer,
                        target_index=(int, Field(ge=0, le=shown - 1, description=_TARGET)))


@functools.lru_cache(maxsize=256)
def resolutions_answer(candidates: int, most_shown: int) -> type[ResolutionsAnswer]:
    """``ResolutionsAnswer`` for ``candidates`` candidates, each index one that exists."""
    if candidates < 1 or most_shown < 1:
        return ResolutionsAnswer
    base = ResolutionAnswer.model_fields
    # The candidate first: a model names what it classifies before it classifies it.
    one = create_model(f"IndexedResolutionAnswer{candidates}x{most_shown}", __base__=BaseModel,
                       candidate_index=(int, Field(ge=0, le=candidates - 1, description="which candidate this classifies")),
                       operation=(base["operation"].annotation, ...),
                       target_index=(int, Field(ge=0, le=most_shown - 1, description=_TARGET)),
                       reason=(str, Field(min_length=1, max_length=MAX_TEXT_CHARS)))
    return create_model(f"ResolutionsAnswer{candidates}x{most_shown}", __base__=ResolutionsAnswer,
                        resolutions=(list[one], Field(min_length=candidates, max_length=candidates)))  # type: ignore[valid-type]


class RelationAnswer(BaseModel):
    source: str = Field(min_length=1, description='"I" for the user, else the entity name')
    relation: str = Field(min_length=1, max_length=MAX_SLOT_CHARS,
                          description="snake_case, e.g. works_at, managed_by, lives_in, has_child")
    target: str = Field(min_length=1, max_length=MAX_SLOT_CHARS)
    target_is_entity: bool
    confidence: float = Field(ge=0, le=1)
    explicit: bool
    valid_at: WorldTime = None
    negated: bool = False


class RelationsAnswer(BaseModel):
    relations: list[RelationAnswer] = Field(max_length=MAX_ITEMS)


RELATE_TOOL = "record_relations"


RELATE_PROMPT = (
    "You extract relationships stated or implied in one conversation turn as (source, relation, target) "
    'triples. Name the user "I". Use short snake_case relations (works_at, managed_by, lives_in, married_to, '
    "has_child, friend_of, has_pet...). negated=true when the user says a relationship ended or explicitly asks "
    "to forget it. valid_at only from a date said of that relationship (a birthday does not date has_child). "
    f"Always answer by calling {RELATE_TOOL}; an empty list is fine."
)


class TurnAnswer(BaseModel):
    facts: list[FactAnswer] = Field(max_length=MAX_ITEMS)
    relations: list[RelationAnswer] = Field(max_length=MAX_ITEMS)


TURN_TOOL = "record_turn"


TURN_PROMPT = (
    "You read one conversation turn for two things at once.\n\nFACTS. " + EXTRACT_PROMPT.replace(
        f"Always answer by calling {EXTRACT_TOOL}; an empty list is fine.", "")
    + "\n\nRELATIONS. " + RELATE_PROMPT.replace(f"Always answer by calling {RELATE_TOOL}; an empty list is fine.", "")
    + f"\n\nAlways answer by calling {TURN_TOOL} with both lists; empty lists are fine."
)



RESOLVE_ALL_PROMPT = RESOLVE_PROMPT.replace(f"Always answer by calling {RESOLVE_TOOL}.", "") + (
    "Classify every candidate, each against its own list of existing facts. "
    f"Always answer by calling {RESOLVE_ALL_TOOL} once, with one resolution per candidate.")


def _candidate(candidate: CandidateFact) -> str:
    return json.dumps({"text": candidate.text, "attribute": candidate.attribute, "value": candidate.value,
                       "negated": candidate.negated})


def _existing(neighbours: Sequence[ExistingFact], indent: str = "") -> str:
    # Numbered: the model answers with an index, mapped back to the fact id here (it never sees ids).
    return "\n".join(f"{indent}[{i}] {n.text} (attribute={n.attribute}, similarity={n.similarity:.2f})"
                     for i, n in enumerate(neighbours)) or f"{indent}(none)"


def resolve_question(candidate: CandidateFact, neighbours: Sequence[ExistingFact]) -> str:
    """What a resolution call shows the model: the candidate and the existing facts, numbered."""
    return f"Candidate: {_candidate(candidate)}\nExisting facts:\n{_existing(neighbours)}"


def resolve_all_question(asked: Sequence[tuple[CandidateFact, Sequence[ExistingFact]]]) -> str:
    """What one call resolving a turn's candidates shows: each with its own numbered facts."""
    return "\n\n".join(
        f"Candidate {c}: {_candidate(candidate)}\n"
        f"Existing facts for candidate {c} (target_index counts in this list):\n{_existing(neighbours, '  ')}"
        for c, (candidate, neighbours) in enumerate(asked))


def resolutions_of(out: ResolutionsAnswer, asked: Sequence[tuple[CandidateFact, Sequence[ExistingFact]]]
                   ) -> list[Resolution]:
    """One resolution per asked pair, in order; an answer that does not classify each once is malformed."""
    by_index = {r.candidate_index: r for r in out.resolutions}
    if sorted(r.candidate_index for r in out.resolutions) != list(range(len(asked))):
        raise MalformedOutput(f"{RESOLVE_ALL_TOOL} must classify candidates 0..{len(asked) - 1} once each, "
                              f"got {sorted(by_index)}")
    return [resolution_of(by_index[c], neighbours) for c, (_, neighbours) in enumerate(asked)]


REFLECT_TOOL = "record_reflection"
REFLECT_PROMPT_VERSION = "reflect-v3"
REFLECT_PROMPT = (
    "You read several memories of the USER, close in meaning: facts a memory holds about them and things they "
    "said. Write one short sentence about the user that says what the memories show together: a pattern, a habit, "
    "a lasting interest. Use only what these memories say, in their words where you can: no new names, places, "
    "numbers or reasons. Cite by number every memory the sentence rests on (at least two). If they show nothing "
    f"together, write the sentence that lists what they share and cite them all. Always answer by calling "
    f"{REFLECT_TOOL}."
)


class ReflectionAnswer(BaseModel):
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="one sentence about the user")
    cited: list[int] = Field(min_length=2, max_length=32, description="the numbers of the memories it rests on")


def reflect_question(memories: Sequence[str]) -> str:
    return "Memories of the user:\n" + "\n".join(f"{i}. {m}" for i, m in enumerate(memories))


def reflection_of(out: ReflectionAnswer, shown: int):
    from memstream.llm.protocols import Reflection

    cited = tuple(dict.fromkeys(i for i in out.cited))
    if any(not 0 <= i < shown for i in cited):
        raise MalformedOutput(f"{REFLECT_TOOL}: cited a memory that was not shown ({shown} were)")
    return Reflection(out.text.strip(), cited)
