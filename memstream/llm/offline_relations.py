"""The deterministic relation extractor: the offline rules, read as (source, relation, target).
The user's name, family, pets, friends, partner, home and teams, and their ends, are read by the
facts extractor's own patterns, so an edge and a fact say the same one ("my dog Rex": ``has_pet``
Rex and the pet fact Rex; "Rex died" ends both)."""
from __future__ import annotations

import re
from typing import Iterator, Sequence

from memstream.llm.offline import (_FROM, _I, _NAME_RULES, _NOT_NAMES as _NOT_FACT_NAMES, _PERSON, _PET_RULES, _PROPER,
                                   _RELATIVE, _TOLD, _UP, _VALUE, _KINDS, _LETTER, _clean, _name_of, _parts,
                                   _told_value)
from memstream.llm.offline_dates import date_of
from memstream.llm.relations import USER, RelationCandidate
from memstream.schemas import TurnRecorded

_ROLES = {"daughter": "has_child", "son": "has_child", "wife": "married_to", "husband": "married_to",
          "partner": "married_to", "boyfriend": "married_to", "girlfriend": "married_to", "sister": "has_sibling",
          "brother": "has_sibling", "mother": "has_parent", "mom": "has_parent", "mum": "has_parent",
          "father": "has_parent", "dad": "has_parent", "friend": "friend_of", "dog": "has_pet", "cat": "has_pet",
          "puppy": "has_pet", "kitten": "has_pet", "parrot": "has_pet", "rabbit": "has_pet", "hamster": "has_pet",
          "horse": "has_pet", "fish": "has_pet"}
_NAME = r"(?P<t>" + _PERSON + ")"
_SUBJECT = r"(?P<s>(?<![\w'’-])(?!I\b)" + _UP + _LETTER + "++)"  # a third person's first name (not "I")

_RULES: list[tuple[re.Pattern, str, bool]] = [
    # (pattern with groups t [and s], relation, negated)
    (re.compile(_I + r"\s+(?:currently |still |now )?(?:work|am working|'m working) (?:at|for) " + _VALUE.replace("value", "t")), "works_at", False),
    (re.compile(_I + r"(?:'ve| have)?\s+(?:just |recently )?(?:joined|started (?:a new job |working )?at) " + _PROPER.replace("value", "t")), "works_at", False),
    (re.compile(_I + r"(?:'m| am) employed by " + _PROPER.replace("value", "t")), "employed_by", False),
    (re.compile(_I + r"\s+(?:work|am working|'m working) as (?:a|an) [^,.;!?]{1,80}? (?:at|for) " + _PROPER.replace("value", "t")), "works_at", False),
    (re.compile(_I + r"(?:'ve| have)?\s+(?:just |recently )?joined " + _PROPER.replace("value", "t") + r" as\b"), "works_at", False),
    (re.compile(_I + r"\s+(?:no longer|don't|do not) work (?:at|for) " + _VALUE.replace("value", "t")), "works_at", True),
    (re.compile(_I + r"\s+(?:quit|left) (?:my job at |my job with |working at )?" + _PROPER.replace("value", "t")), "works_at", True),
    (re.compile(_I + r"\s+(?:no longer|don't|do not) live in " + _VALUE.replace("value", "t")), "lives_in", True),
    (re.compile(_I + r"\s+(?:currently |still )?(?:live|am living|'m living) in " + _VALUE.replace("value", "t")), "lives_in", False),
    (re.compile(_I + r"(?:'ve| have)?\s+(?:just |recently |finally )?(?:moved|relocated) " + _FROM + "to "
                + _VALUE.replace("value", "t")), "lives_in", False),
    (re.compile(r"\b[Mm]y (?:new )?(?:manager|boss|supervisor) is (?:now )?" + _NAME), "managed_by", False),
    (re.compile(_I + r" (?:now )?report to " + _NAME), "reports_to", False),
    (re.compile(_NAME + r" is (?:now )?my (?:new )?(?:manager|boss)"), "has_manager", False),
    (re.compile(_SUBJECT + r" (?:works at|works for|has joined|joined) " + _PROPER.replace("value", "t")), "works_at", False),
    (re.compile(_SUBJECT + r" lives in " + _PROPER.replace("value", "t")), "lives_in", False),
]
_NOT_NAMES = {"She", "He", "They", "We", "It", "This", "That", "There", "My", "Our", "Your", "The", *_NOT_FACT_NAMES}


class OfflineRelationExtractor:
    """Rule-based ``RelationExtractionClient``. Everything the user states is explicit."""

    model_id = "offline-relations-v1"

    async def extract(self, turn: TurnRecorded) -> Sequence[RelationCandidate]:
        return extract_relations(turn)


def _said(part: str) -> Iterator[tuple[re.Match, str, str, str, bool, bool]]:
    """(match, source, relation, target, negated, dated) of each relation ``part`` states."""
    for pattern in _NAME_RULES:
        for m in pattern.finditer(part):
            if name := _name_of(m):
                yield m, USER, "is_named", name, False, False
    for pattern in (_RELATIVE, *_PET_RULES):  # kinship is not dated by the sentence (a birthday is not its start)
        for m in pattern.finditer(part):
            if (role := m.groupdict().get("rel") or m.group("pet")) in _ROLES:
                yield m, USER, _ROLES[role], m.group("value"), False, False
    for pattern, relation, negated in _RULES:
        for m in pattern.finditer(part):
            yield m, m.groupdict().get("s") or USER, relation, _clean(m.group("t")), negated, True
    for pattern, kind, negated in _TOLD:
        for m in pattern.finditer(part):
            if value := _told_value(m, kind, negated):
                yield m, USER, _KINDS[kind][3], value, negated, True


def extract_relations(turn: TurnRecorded) -> list[RelationCandidate]:
    found: dict[tuple, RelationCandidate] = {}
    for sentence in re.split(r"(?<=[.!?])\s+|\n+", turn.user_message):
        said = []
        for part, forget in _parts(sentence):
            for m, source, rel, target, negated, dated in _said(part):
                if not target or target in _NOT_NAMES or source in _NOT_NAMES:
                    continue
                if rel == "lives_in" and target.casefold().endswith(" team"):
                    continue  # "I moved to the Data team": a team
                if forget and (negated or rel == "is_named"):
                    continue  # forgetting a retraction, or a name (an alias stays), changes no edge
                # A job or a home is dated by its own clause only.
                when = date_of(part, m.start(), m.end(), turn.occurred_at, past=True) if dated and not forget else None
                said.append(RelationCandidate(source=source, relation=rel, target=target, target_is_entity=True,
                                              confidence=0.9 if source == USER else 0.8, explicit=True,
                                              valid_at=when, negated=negated or forget))
        ended = {(c.source, c.relation, c.target.casefold()) for c in said if c.negated}
        for c in said:  # "My dog Rex died": the edge ends, it is not opened
            if c.negated or (c.source, c.relation, c.target.casefold()) not in ended:
                found.setdefault((c.source, c.relation, c.target.casefold(), c.negated), c)
    return list(found.values())


class OfflineTurnExtractor:
    """``TurnExtractionClient`` over two other extractors (default: the offline rules): the
    candidates each would find, in one call."""

    def __init__(self, facts=None, relations=None):
        from memstream.llm.offline import OfflineExtractor

        self._facts, self._relations = facts or OfflineExtractor(), relations or OfflineRelationExtractor()
        self.model_id, self.relations_model_id = self._facts.model_id, self._relations.model_id

    async def extract_turn(self, turn: TurnRecorded):
        from memstream.llm.protocols import TurnCandidates

        return TurnCandidates(list(await self._facts.extract(turn)), list(await self._relations.extract(turn)))
