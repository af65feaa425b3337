"""The deterministic relation extractor: the offline rules, read as (source, relation, target)."""
from __future__ import annotations

import re
from typing import Sequence

from memstream.llm.offline import _I, _PROPER, _VALUE, _clean, _dated, _parts
from memstream.llm.relations import USER, RelationCandidate
from memstream.schemas import TurnRecorded

_ROLES = {"daughter": "has_child", "son": "has_child", "wife": "married_to", "husband": "married_to",
          "partner": "married_to", "sister": "has_sibling", "brother": "has_sibling", "mother": "has_parent",
          "mom": "has_parent", "mum": "has_parent", "father": "has_parent", "dad": "has_parent",
          "friend": "friend_of", "dog": "has_pet", "cat": "has_pet", "manager": "managed_by", "boss": "managed_by",
          "supervisor": "managed_by"}
_NAME = r"(?P<t>[A-Z][a-z]+(?: [A-Z][a-z]+)?)"
_SUBJECT = r"(?P<s>(?!I\b)[A-Z][a-z]+)"  # a third person's first name (not "I")

_RULES: list[tuple[re.Pattern, str | None, bool]] = [
    (re.compile(r"\b(?i:my name is|call me)\s+" + _NAME), "is_named", False),
    (re.compile(r"^(?:(?:Hi|Hello|Hey)[!,. ]+)?(?:I'm|I am)\s+" + _NAME + r"(?=\s*[,.!]|\s+and\b|$)"), "is_named", False),
    # (pattern with groups t [and s], relation, negated); relation None = from the matched role word
    (re.compile(_I + r"\s+(?:currently |still |now )?(?:work|am working|'m working) (?:at|for) " + _VALUE.replace("value", "t")), "works_at", False),
    (re.compile(_I + r"(?:'ve| have)?\s+(?:just |recently )?(?:joined|started (?:a new job |working )?at) " + _PROPER.replace("value", "t")), "works_at", False),
    (re.compile(_I + r"(?:'m| am) employed by " + _PROPER.replace("value", "t")), "employed_by", False),
    (re.compile(_I + r"\s+(?:work|am working|'m working) as (?:a|an) [^,.;!?]{1,80}? (?:at|for) " + _PROPER.replace("value", "t")), "works_at", False),
    (re.compile(_I + r"(?:'ve| have)?\s+(?:just |recently )?joined " + _PROPER.replace("value", "t") + r" as\b"), "works_at", False),
    (re.compile(_I + r"\s+(?:no longer|don't|do not) work (?:at|for) " + _VALUE.replace("value", "t")), "works_at", True),
    (re.compile(_I + r"\s+(?:quit|left) (?:my job at |my job with |working at )?" + _PROPER.replace("value", "t")), "works_at", True),
    (re.compile(_I + r"\s+(?:no longer|don't|do not) live in " + _VALUE.replace("value", "t")), "lives_in", True),
    (re.compile(_I + r"\s+(?:currently |still )?(?:live|am living|'m living) in " + _VALUE.replace("value", "t")), "lives_in", False),
    (re.compile(_I + r"(?:'ve| have)?\s+(?:just |recently |finally )?(?:moved|relocated) to " + _VALUE.replace("value", "t")), "lives_in", False),
    (re.compile(r"\b[Mm]y (?:new )?(?:manager|boss|supervisor) is (?:now )?" + _NAME), "managed_by", False),
    (re.compile(_I + r" (?:now )?report to " + _NAME), "reports_to", False),
    (re.compile(_NAME + r" is (?:now )?my (?:new )?(?:manager|boss)"), "has_manager", False),
    (re.compile(r"\b[Mm]y (?P<role>daughter|son|wife|husband|partner|sister|brother|mother|mom|mum|father|dad|friend|dog|cat)"
                r"(?:'s name is|,| is called| called| named)? " + _NAME), None, False),
    (re.compile(_SUBJECT + r" (?:works at|works for|has joined|joined) " + _PROPER.replace("value", "t")), "works_at", False),
    (re.compile(_SUBJECT + r" lives in " + _PROPER.replace("value", "t")), "lives_in", False),
]
_NOT_NAMES = {"She", "He", "They", "We", "It", "This", "That", "There", "My", "Our", "Your", "The", "Sorry", "Fine",
              "Good", "Great", "Here", "Back", "Not", "Just", "So", "Very", "Really", "Also", "Still", "Happy", "Glad"}


class OfflineRelationExtractor:
    """Rule-based ``RelationExtractionClient``. Everything the user states is explicit."""

    model_id = "offline-relations-v1"

    async def extract(self, turn: TurnRecorded) -> Sequence[RelationCandidate]:
        return extract_relations(turn)


def extract_relations(turn: TurnRecorded) -> list[RelationCandidate]:
    found: dict[tuple, RelationCandidate] = {}
    for sentence in re.split(r"(?<=[.!?])\s+|\n+", turn.user_message):
        for part, forget in _parts(sentence):
            for pattern, relation, negated in _RULES:
                for m in pattern.finditer(part):
                    groups = m.groupdict()
                    target = _clean(groups["t"])
                    source = groups.get("s") or USER
                    if not target or target in _NOT_NAMES or source in _NOT_NAMES:
                        continue
                    rel = relation or _ROLES[groups["role"]]
                    if forget and (negated or rel == "is_named"):
                        continue  # forgetting a retraction, or a name (an alias stays), changes no edge
                    # A kinship or a name is not dated by the sentence ("my daughter Lily turns 7 on
                    # October 12th" is her birthday); a job or a home by its own clause only.
                    when = None if forget or relation in (None, "is_named") else _dated(
                        part, m.start(), m.end(), turn.occurred_at, past=True)
                    c = RelationCandidate(source=source, relation=rel, target=target, target_is_entity=True,
                                          confidence=0.9 if source == USER else 0.8, explicit=True,
                                          valid_at=when, negated=negated or forget)
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
