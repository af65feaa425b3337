"""What a fact's ``attribute`` and an edge's ``relation`` mean, for every part that reads them:
formation (an UPDATE supersedes; a new target closes a single-valued relation's edge), the
profile, and the read path (one current value per single-valued slot)."""
from __future__ import annotations

import re

# Attributes holding one value at a time: a new value supersedes the old one. Every
# ``favourite_*`` attribute does too (one favourite book at a time).
SINGLE_VALUED = frozenset({"name", "home", "origin", "employer", "role", "diet", "age", "partner"})


def single_valued(attribute: str) -> bool:
    """One value at a time: a named slot, a favourite, or a slot the graph states with a
    single-valued relation (a ``manager`` as ``managed_by``): facts and edges agree on it."""
    if attribute in SINGLE_VALUED or attribute.startswith("favourite_"):
        return True
    relation = relation_of(attribute)
    return relation is not None and relation not in MULTI_VALUED


# canonical fact slot -> names a model gives it. A slot's name decides what a new value does (an
# UPDATE of a single-valued slot) and what a restatement is (the same slot and value): "company"
# and "employer" must be one slot, or a change of job is stored beside the old one.
_SLOTS: dict[str, tuple[str, ...]] = {
    "name": ("first_name", "full_name", "user_name", "username", "preferred_name"),
    "home": ("residence", "lives_in", "home_city", "current_city", "city_of_residence", "home_town_now",
             "current_location", "living_in"),
    "origin": ("hometown", "home_town", "birthplace", "place_of_birth", "born_in", "grew_up_in", "from",
               "country_of_origin", "is_from"),
    "employer": ("company", "workplace", "employer_name", "works_at", "works_for", "current_employer", "job_company",
                 "organisation", "organization"),
    "role": ("job_title", "occupation", "profession", "position", "job_role", "works_as"),
    "likes": ("like", "enjoys", "loves", "hobby", "hobbies", "interest", "interests", "preference"),
    "dislikes": ("dislike", "hates", "does_not_like", "doesnt_like"),
    "allergy": ("allergies", "allergic_to", "food_allergy"),
    "diet": ("dietary_preference", "diet_type", "dietary_restriction", "eating_habit"),
    "age": ("user_age", "years_old"),
}
_SLOT_OF = {alias: slot for slot, aliases in _SLOTS.items() for alias in aliases}


def fact_attribute(attribute: str) -> str:
    """The slot ``attribute`` names, in memstream's words ("company" -> "employer",
    "Favorite Book" -> "favourite_book"); a name it does not know is kept, in snake_case."""
    key = re.sub(r"[^\w]+", "_", attribute.strip().casefold()).strip("_") or attribute
    key = re.sub(r"^favorite_", "favourite_", key)
    return _SLOT_OF.get(key, key)


# canonical relation -> phrasings that mean the same thing
_SYNONYMS: dict[str, tuple[str, ...]] = {
    "works_at": ("employed_by", "works_for", "employee_of", "job_at", "employer"),
    "managed_by": ("has_manager", "reports_to", "manager", "boss", "supervised_by", "has_boss"),
    "lives_in": ("resides_in", "based_in", "home", "lives_at", "home_city"),
    "married_to": ("spouse_of", "has_spouse", "has_wife", "has_husband", "wife", "husband", "partner_of",
                   "has_partner", "partner"),
    "has_child": ("parent_of", "has_daughter", "has_son", "daughter", "son", "child"),
    "has_sibling": ("sibling_of", "has_sister", "has_brother", "sister", "brother"),
    "has_parent": ("child_of", "has_mother", "has_father", "mother", "father", "mom", "mum", "dad"),
    "friend_of": ("has_friend", "friends_with", "friend"),
    "has_pet": ("owns_pet", "has_dog", "has_cat", "pet", "dog", "cat"),
    "from": ("is_from", "born_in", "origin", "comes_from"),
    "studies_at": ("student_at", "attends", "enrolled_at"),
    "member_of": ("team", "on_team", "member_of_team", "team_member_of"),  # a team at work
}
CANONICAL = {alias: name for name, aliases in _SYNONYMS.items() for alias in (name, *aliases)}
# Relations that may hold for several targets at once; every other relation is single-valued
# per (source, relation): a new target closes the current edge.
MULTI_VALUED = frozenset({"has_child", "has_sibling", "has_parent", "friend_of", "has_pet", "knows", "likes",
                          "member_of"})

_SENTENCES = {
    "works_at": "{s} works at {t}", "managed_by": "{s} is managed by {t}", "lives_in": "{s} lives in {t}",
    "married_to": "{s} is married to {t}", "has_child": "{s} has a child named {t}",
    "has_sibling": "{s} has a sibling named {t}", "has_parent": "{s} has a parent named {t}",
    "friend_of": "{s} is friends with {t}", "has_pet": "{s} has a pet named {t}", "from": "{s} is from {t}",
    "studies_at": "{s} studies at {t}", "member_of": "{s} is a member of {t}",
}


def canonical(relation: str) -> str:
    """The canonical name of ``relation``; unknown relations are kept (normalised)."""
    key = re.sub(r"[^a-z0-9]+", "_", relation.strip().lower()).strip("_")
    return CANONICAL.get(key, key)


def relation_of(attribute: str) -> str | None:
    """The relation of the user's graph that states the fact slot ``attribute`` ("home":
    ``lives_in``, "sister": ``has_sibling``), or None when the graph has none (a name, a like):
    a fact of that slot and the user's edge of that relation to the same value are one truth."""
    relation = canonical(attribute)
    return relation if relation in _SYNONYMS else None


def attributes_of(relation: str) -> tuple[str, ...]:
    """The fact slots ``relation`` states (``relation_of``'s inverse)."""
    return tuple(sorted(a for a, name in CANONICAL.items() if name == relation and relation in _SYNONYMS))


def fact_sentence(source: str, relation: str, target: str) -> str:
    template = _SENTENCES.get(relation, "{s} " + relation.replace("_", " ") + " {t}")
    return template.format(s=source, t=target)
