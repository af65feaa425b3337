"""A deterministic, rule-based extractor and resolver: no model, no network.

Good enough for the demo and the tests, and a real component: its rules are general patterns of
first-person English (where the user lives or works, names, preferences and dislikes,
allergies and diets, family, pets and teams, plans with dates, corrections, negations (a pet, a
friend, a partner, a home or a team gone: only the one named) and requests to forget), in any
script, unit-tested on sentences written apart from the rules. A date dates only the phrase of its
own clause. Statements by the user are explicit; what is only implied (the assistant greeting
the user by a name) is inferred, with lower confidence.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

from memstream.llm.offline_dates import COUNTS, LONG_MONTHS, NEAR, clause_after, date_of, when_said
from memstream.llm.protocols import CandidateFact, ExistingFact, Operation, Resolution
from memstream.schemas.vocabulary import single_valued
from memstream.schemas import TurnRecorded

# A value ends where its date begins ("I moved to Lisbon two days ago": the home is Lisbon).
_STOP = (r"(?=(?i:\s*(?:,|;|\.|!|\?|$| and | but | because | so | since | which | where | with | for | from now| now\b"
         r"| last | next | this | in (?:19|20)\d\d| (?:in|on) (?:%s)\b| (?:yesterday|today|tomorrow)\b"
         r"| (?:\d{1,3}|%s) (?:day|week|month|year)s? ago\b)))" % (LONG_MONTHS, COUNTS))
_VALUE = r"(?P<value>[^,.;!?]+?)" + _STOP
_FROM = r"(?:(?:away |back )?from [^,.;!?]{1,60}? )?"  # "I moved from Porto to Lisbon"


def _class(keep: Callable[[str], bool]) -> str:
    """The regex class of what ``keep`` holds below U+20000 (every cased letter and mark): ``re`` has no \\p{Lu}."""
    kept = [i for i in range(0x20000) if keep(chr(i))]
    starts = [i for n, i in enumerate(kept) if n == 0 or kept[n - 1] != i - 1]
    ends = [i for n, i in enumerate(kept) if n == len(kept) - 1 or kept[n + 1] != i + 1]
    return "[" + "".join(re.escape(chr(a)) + ("-" + re.escape(chr(b)) if b > a else "") for a, b in zip(starts, ends)) + "]"


_MARKS = _class(lambda c: unicodedata.category(c)[0] == "M")  # "e" + U+0308 is "ë" too
_LETTER = r"(?:[^\W\d_]|%s)" % _MARKS  # a letter of any script, or a mark on one
# A capital: a letter that is not lowercase ("Z", "Ø", "Д", and "张", of a script without case);
# _UP, an uppercase letter only. Case-sensitive whatever the rule's flags.
_CAP = r"(?-i:(?!%s)[^\W\d_])" % _class(str.islower)
_UP = r"(?-i:%s)" % _class(lambda c: c.isupper() or c.istitle())
_WORD = _CAP + r"(?:-?" + _LETTER + r")*+"  # "Zoë", "Jean-Luc", "Łukasz", "Дмитрий", "محمد"
# A person's name: a first name, perhaps a surname ("Ana", "Ana Silva"); not a word's tail.
_PERSON = r"(?<![\w'’-])" + _WORD + r"(?: " + _CAP + r"(?:-?" + _LETTER + r")++)?"
_PROPER = (r"(?P<value>{w}(?:\s+(?:{w}|(?:of|de|da|do|del|von|van)\b))*)"
           .format(w=_CAP + r"(?:[\w'&-]|" + _MARKS + ")*+"))
# The subject: "I", or nothing after "and" ("I live in Lisbon and work at Acme").
_I = r"(?:\b[iI](?=\s|')|\band(?=\s+(?:work|live|moved|joined)))"
_NOT_NAMES = frozenset({"Sorry", "Fine", "Good", "Great", "Here", "Back", "Not", "Just", "So", "Very",
                        "Really", "Also", "Still", "Okay", "Ok", "Happy", "Glad", "Excited", "Done"})
# Not a pet, a friend or a partner that ended ("She left me", "Mom passed away").
_NOT_ENDED = _NOT_NAMES | {"I", "He", "She", "It", "They", "We", "You", "This", "That", "There", "The", "My", "Our",
                           "Mom", "Mum", "Dad", "Mama", "Papa", "Grandma", "Grandpa", "Granny", "Nana", "God"}
_RELATIVES = ("daughter", "son", "wife", "husband", "partner", "sister", "brother", "mother", "mom",
              "mum", "father", "dad", "boyfriend", "girlfriend", "grandmother", "grandfather", "friend")
_PETS = ("dog", "cat", "puppy", "kitten", "parrot", "rabbit", "hamster", "horse", "fish")
_PARTNERS = {"wife", "husband", "partner", "boyfriend", "girlfriend"}
# What opens a clause or an aside after a list, not an item of it ("peanuts, by the way").
_CLAUSE = re.compile(r"(?i)^(?:as|so|but|which|if|when|you|i|please|just|though|too|also|really|by the way|btw|"
                     r"in case|honestly|actually|anyway|of course)\b")


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern
    build: Callable[[re.Match, TurnRecorded], Iterator[CandidateFact]]


def _clean(value: str) -> str:
    value = re.sub(r"^(?:[Tt]he|a|an|[Mm]y)\s+", "", value.strip())  # not "A Coruña"
    # "a dispatcher now", "in Plovdiv myself", "in Leeds too"
    value = re.sub(r"\s+(?:now|these days|nowadays|anymore|again|myself|too|as well)$", "", value)
    return value.strip(" '\"")




def _fact(text, category, attribute, value, *, explicit=True, confidence=0.9, valid_at=None, negated=False):
    return CandidateFact(text=text, category=category, attribute=attribute, value=value,
                         confidence=confidence, explicit=explicit, valid_at=valid_at, negated=negated)


def _rule(pattern: str | re.Pattern, flags=re.I):
    def register(build):
        _RULES.append(_Rule(pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, flags), build))
        return build
    return register


_RULES: list[_Rule] = []


# "My name is Zoë", "Hi, I'm Ørjan", "Hey there, I'm Ana": the relation extractor's too.
_NAME_RULES = (re.compile(r"\b(?i:my name is|i'm called|i am called|call me|name's)\s+" + _PROPER),
               re.compile(r"^(?:(?i:(?:hi|hello|hey|hiya|howdy|greetings|good (?:morning|afternoon|evening))"
                          r"(?: there| all| everyone)?)[!,.\s]+)?(?i:i['’]m|i am)\s+" + _PROPER + r"(?=\s*[,.!]|\s+and\b|$)"),
               # "Rahul here." / "Hi, Noor here:": introducing oneself at the start of a message
               re.compile(r"^(?:\S+(?:\s\S+)?[!,.]\s+)?(?P<value>" + _WORD + r")\s+(?i:here)\b(?=\s*[,.!:;]|$)"))


def _name_of(m: re.Match) -> str | None:
    name = m.group("value").split()[0] if len(m.group("value").split()) > 2 else m.group("value")
    return None if name in _NOT_NAMES else name


@_rule(_NAME_RULES[0])
@_rule(_NAME_RULES[1])
@_rule(_NAME_RULES[2])
def _name(m, turn):
    if name := _name_of(m):
        yield _fact(f"Name is {name}", "identity", "name", name)


@_rule(_I + r"\s+(?:currently |still )?(?:live|am living|'m living|reside) in " + _VALUE)
@_rule(r"\bmy home is (?:in|now in) " + _VALUE)
@_rule(_I + r"(?:'m| am) (?:now )?based in " + _VALUE)
@_rule(_I + r"(?:'ve| have)?\s+(?:just |recently |finally )?(?:moved|relocated) " + _FROM + "to " + _VALUE)
def _home(m, turn):
    value = _clean(m.group("value"))
    if value.casefold().endswith(" team"):
        return  # "I moved to the Data team": a team (_TOLD)
    when = date_of(m.string, m.start(), m.end(), turn.occurred_at, past=True)
    yield _fact(f"Lives in {value}", "location", "home", value, valid_at=when)


@_rule(_I + r"(?:'m| am) (?:originally )?from " + _PROPER, 0)
def _origin(m, turn):
    yield _fact(f"Is from {m.group('value')}", "location", "origin", m.group("value"))


# "The same company" or "that place" points back at an employer rather than naming one: the
# name may follow it ("the same company, Van Dijk Transport").
_APPOSITIVE = re.compile(r",\s+" + _PROPER + r"(?=\s*[,.;!?]|$)")
_POINTER = re.compile(r"(?i)(?:the\s+)?(?:same|that|this|said|other|his|her|their|your)\b")


def _organisation(m: re.Match) -> str | None:
    if not _POINTER.match(m.group("value").strip()):
        return _clean(m.group("value"))
    named = _APPOSITIVE.match(m.string, m.end("value"))
    return named.group("value") if named else None


@_rule(_I + r"\s+(?:currently |still |now )?(?:work|am working|'m working) (?:at|for) " + _VALUE)
@_rule(_I + r"(?:'ve| have)?\s+(?:just |recently )?(?:joined|started (?:a new job |working )?at) " + _PROPER, 0)
def _employer(m, turn):
    if (value := _organisation(m)) is None:
        return
    when = date_of(m.string, m.start(), m.end(), turn.occurred_at, past=True)
    yield _fact(f"Works at {value}", "work", "employer", value, valid_at=when)


@_rule(_I + r"\s+(?:work|am working|'m working) as (?:a|an) (?P<role>[^,.;!?]+?)(?: (?:at|for) " + _VALUE + r")?" + _STOP)
# Bounded: an unbounded lazy role is tried from every "I am a" to the end of the turn (quadratic).
@_rule(_I + r"(?:'m| am) (?:a|an) (?P<role>[a-z][a-z -]{1,60}?) (?:at|for) " + _VALUE)
def _role(m, turn):
    role = _clean(m.group("role"))
    yield _fact(f"Works as a {role}", "work", "role", role)
    if m.groupdict().get("value") and (employer := _organisation(m)) is not None:
        yield _fact(f"Works at {employer}", "work", "employer", employer)


@_rule(_I + r"\s+(?:really |absolutely |also )?(?:love|like|enjoy|adore)\s+(?!you\b|it\b|that\b|this\b)" + _VALUE)
def _likes(m, turn):
    if re.match(r"(?i)my\s", m.group("value")):
        return  # "I love my job": fondness for what one has, not a taste to recommend by
    value = _clean(m.group("value"))
    yield _fact(f"Likes {value}", "preference", "likes", value, confidence=0.8)


@_rule(_I + r"\s+(?:really )?(?:hate|dislike|can't stand|cannot stand|don't like|do not like)\s+" + _VALUE)
def _dislikes(m, turn):
    value = _clean(m.group("value"))
    yield _fact(f"Dislikes {value}", "preference", "dislikes", value, confidence=0.8)


@_rule(r"\bmy (?:all[- ]time )?favou?rite (?P<thing>[a-z]+(?: [a-z]+)?)(?: (?:this|of the) year)? is " + _VALUE)
def _favourite(m, turn):
    thing, value = m.group("thing"), _clean(m.group("value"))
    yield _fact(f"Favourite {thing} is {value}", "preference", f"favourite_{thing.replace(' ', '_')}", value, confidence=0.85)


@_rule(_I + r"(?:'m| am) (?:severely |very )?allergic to (?P<value>[^.;!?]+?)(?=\s+(?:but|so|because|which|when)\b|[.;!?]|$)")
def _allergy(m, turn):
    for part in re.split(r"\s*(?:,|\band\b|\bor\b)\s*", m.group("value")):
        part = _clean(part)
        # "peanuts, as you know": keep list items, not the clause that follows the list.
        if part and len(part.split()) <= 4 and not _CLAUSE.match(part):
            yield _fact(f"Allergic to {part}", "constraint", "allergy", part, confidence=0.95)


@_rule(_I + r"(?:'m| am|'ve been| have been) (?:a |strictly )?(?P<value>vegetarian|vegan|pescatarian|gluten[- ]free|halal|kosher)\b")
def _diet(m, turn):
    yield _fact(f"Diet is {m.group('value').lower()}", "constraint", "diet", m.group("value").lower(), confidence=0.95)


_CALLED = r"(?:'s name is|,| is called| called| named)?\s+(?P<value>" + _PERSON + ")"
_RELATIVE = re.compile(r"\b[Mm]y (?P<rel>%s)" % "|".join(_RELATIVES) + _CALLED)
_PET_RULES = (re.compile(r"\b(?:[Mm]y|[Oo]ur) (?P<pet>%s)" % "|".join(_PETS) + _CALLED),
              re.compile(_I + r" (?:have|'ve got|have got) (?:a|an) (?P<pet>%s) (?:called|named) (?P<value>%s)"
                         % ("|".join(_PETS), _PERSON), re.I))


@_rule(_RELATIVE)
def _relative(m, turn):
    rel, name = m.group("rel"), m.group("value")
    if name in _NOT_NAMES:
        return
    attribute = "partner" if rel in _PARTNERS else rel
    yield _fact(f"{rel.capitalize()} is {name}", "relationship", attribute, name)


@_rule(_PET_RULES[0])
@_rule(_PET_RULES[1])
def _pet(m, turn):
    if m.group("value") not in _NOT_NAMES:
        yield _fact(f"Has a {m.group('pet')} named {m.group('value')}", "relationship", "pet", m.group("value"))


@_rule(r"(?:\b[Ww]e're|\b[Ww]e are|" + _I + r"'m|" + _I + r" am|" + _I + r"'ll be|" + _I + r" will be)\s+(?:flying|going|travelling|traveling|heading|visiting|off)\s+(?:to\s+)?" + _PROPER
       + r"(?P<rest>[^.!?]*)", 0)
def _trip(m, turn):
    place = m.group("value")
    if place in _NOT_NAMES:
        return
    when = date_of(m.string, m.start(), m.end("value"), turn.occurred_at)  # "next month I'm flying to ..." too
    suffix = f" ({when:%Y-%m-%d})" if when else ""
    yield _fact(f"Plans a trip to {place}{suffix}", "plan", "trip", place, confidence=0.85, valid_at=when)


@_rule(_I + r"(?:'m| am) (?:moving|relocating) to " + _PROPER + r"(?P<rest>[^.!?]*)", 0)
def _moving(m, turn):
    when = date_of(m.string, m.start(), m.end("value"), turn.occurred_at)
    suffix = f" ({when:%Y-%m-%d})" if when else ""
    yield _fact(f"Plans to move to {m.group('value')}{suffix}", "plan", "move", m.group("value"), valid_at=when)


@_rule(r"\b[Mm]y (?P<who>%s)(?:'s)? (?:\w+ )?(?:turns \d+|birthday is) (?:on )?(?P<rest>[^.!?]*)" % "|".join(_RELATIVES), 0)
def _birthday(m, turn):
    when = when_said(clause_after(m.group("rest")), turn.occurred_at)
    if when:
        yield _fact(f"{m.group('who').capitalize()}'s birthday is {when:%B} {when.day}", "plan", "birthday", m.group("who"),
                    valid_at=when, confidence=0.85)


@_rule(_I + r"\s+(?:no longer|don't|do not) (?:live in|work (?:at|for)) " + _VALUE)
@_rule(_I + r"\s+(?:quit|left) (?:my job at |my job with |working at )?" + _PROPER, 0)
def _stopped(m, turn):
    value = _clean(m.group("value"))
    attribute = "home" if "live" in m.group(0).lower() else "employer"
    verb = "Lives in" if attribute == "home" else "Works at"
    when = date_of(m.string, m.start(), m.end(), turn.occurred_at, past=True)  # "I left Acme last week"
    yield _fact(f"{verb} {value}", "location" if attribute == "home" else "work", attribute, value,
                valid_at=when, negated=True)


@_rule(_I + r"\s+(?:no longer have|don't have|do not have) (?:a|an|my) (?P<pet>%s)" % "|".join(_PETS))
def _no_pet(m, turn):
    yield _fact(f"Has a {m.group('pet')}", "relationship", "pet", "", negated=True)


# A pet, a friend, a partner, a home or a team the user has no longer (or a team they are on), each
# named; the relation extractor reads the same. kind -> (category, fact text, attribute, relation).
_KINDS = {"pet": ("relationship", "Has a pet named {}", "pet", "has_pet"),
          "friend": ("relationship", "Friend is {}", "friend", "friend_of"),
          "partner": ("relationship", "Partner is {}", "partner", "married_to"),
          "home": ("location", "Lives in {}", "home", "lives_in"), "team": ("work", "Is on the {}", "team", "member_of")}
_TOLD: list[tuple[re.Pattern, str, bool]] = []
_N = r"(?P<value>" + _PERSON + r")(?![\w'’])"  # not "Ana's (dog)"
_N2, _PARTNER = _N.replace("value", "value2"), "|".join(sorted(_PARTNERS))
_US = r"(?:%s and (?:I|me)|\b(?:me|I) and %s) " % (_N, _N2)  # "Sam and I", "me and Sam"
_MYPET = r"(?:(?:my|our) (?:(?:old|beloved|sweet|little|poor|family) )?(?:%s),? )" % "|".join(_PETS)
_DIED = (r"(?:(?:has|had|sadly|just|finally|recently) )*(?:died|passed away|passed on|ran away|went missing|gone missing|"
         r"(?:was|got|had to be) put (?:down|to sleep)|(?:was|got) (?:rehomed|re-homed|given away))\b")
# The user, perhaps made to: "we had to", "I've finally decided to" (not "we're going to").
_WE = (r"\b(?:I|we)(?:'ve| have)?(?: (?:just|finally|sadly|recently|eventually|then))?"
       r"(?: (?:had|decided|were forced|needed|chose) to)? ")
_TEAM = r"the (?P<value>[^\W\d_][\w&'’-]*(?: [^\W\d_][\w&'’-]*){0,2}) team\b"
_NOT_TEAMS = {"same", "new", "old", "other", "whole", "entire", "right", "wrong", "winning", "losing", "opposing", "rival"}
_HEDGE = re.compile(r"(?i)\b(?:if|whether|unless|not sure|unsure|worried|scared|fear|hope|hoping|wonder|wondering|"
                    r"imagine|pretend|dream(?:ed|t)?|maybe|perhaps|might|what if|in case|would|could|should|do you|did you)\b")
_HEDGE_AFTER = re.compile(r"(?i)\W*(?:yet\b|in (?:my|a|the|your) (?:dream|nightmare|movie|film|book|story|show|game)\b)")


def _told_value(m: re.Match, kind: str, negated: bool) -> str | None:
    """The one ``m`` names, or None: a word that names nobody, or an ending only hedged ("I'm not
    sure ...", "if ...", a question)."""
    s = m.string
    # Near the match only: a turn may be a pasted page, and every match looking at all of it is quadratic.
    if negated and (s[-NEAR:].rstrip().endswith("?") or _HEDGE.search(s, max(0, m.start() - NEAR), m.start())
                    or _HEDGE_AFTER.match(s, m.end())):
        return None
    value = m.group("value") or m.group("value2")
    if kind == "home":
        value = _clean(value)
        return None if not value or value.casefold().endswith(" team") else value
    if kind == "team":
        return None if value.split()[0].lower() in _NOT_TEAMS else f"{value} team"
    return None if value in _NOT_ENDED else value


def _told_rule(kind: str, negated: bool, *patterns: str):
    def build(m, turn):
        if value := _told_value(m, kind, negated):
            category, text, attribute, _ = _KINDS[kind]
            when = date_of(m.string, m.start(), m.end(), turn.occurred_at, past=True)
            yield _fact(text.format(value), category, attribute, value, valid_at=when, negated=negated)
    for pattern in patterns:
        _TOLD.append((re.compile(pattern, re.I), kind, negated))
        _rule(_TOLD[-1][0])(build)


_told_rule("pet", True, r"\b" + _MYPET + _N + ",? " + _DIED,  # "My dog Rex died", "our cat, Luna, passed away"
           # "Rex passed away", "Sadly, Rex, my dog, was put down"
           r"^\W*(?:(?:sadly|unfortunately|so|and|but|well|oh|anyway)\W+)?" + _N + r"(?:, (?:my|our) (?:%s),)? " % "|".join(_PETS)
           + _DIED, _WE + "lost " + _MYPET + "?" + _N, _WE + "re-?homed? " + _MYPET + "?" + _N,  # "We lost our cat Luna"
           _WE + r"(?:put %s?%s (?:down|to sleep)|(?:had|have|got|get) %s?%s put (?:down|to sleep))\b(?!\s+(?:for|on|at|with|in the)\b)"
           % (_MYPET, _N, _MYPET, _N2), _WE + r"(?:gave|give) (?:away %s?%s|%s?%s (?:away|up for adoption))" % (_MYPET, _N, _MYPET, _N2))
_told_rule("friend", True, _US + r"(?:(?:are|'re|were) (?:no longer|not)|aren't|weren't|(?:have )?stopped being) friends\b",
           _US + r"(?:(?:have |had |'ve )?(?:fell|fallen) out|had a falling[- ]out|(?:have )?(?:ended|broke off) our friendship)\b",
           r"\bI(?:'m| am) (?:no longer|not) friends with (?:my (?:old |best )?friend )?" + _N,
           r"\bI(?: have| had|'ve)? (?:stopped being friends with|(?:fell|fallen) out with|had a falling[- ]out with|(?:ended|broke off) "
           r"(?:my|our) friendship with|cut ties with|unfriended) (?:my (?:old |best )?friend )?" + _N)
_told_rule("partner", True, _US + r"(?:(?:have|had|'ve|just|finally|recently|got|are|were|'re|have been) )*(?:divorced|broke up|"
           r"broken up|split up|separated|called it quits|split\b(?!\s+(?:the|it|our|a|an|this|that|everything)\b))",
           r"\bI(?:'ve|'m)?(?: (?:have|had|just|finally|recently|got|am))* (?:divorced|broke up with|split up with|split from|"
           r"separated from|divorced from) (?:my (?:%s),? )?" % _PARTNER + _N,
           r"\bI(?:'ve)?(?: (?:have|had|just|finally|recently))* (?:left|dumped) my (?:%s),? " % _PARTNER + _N,
           _N + r" (?:(?:has|just|finally) )*(?:broke up with|split up with|dumped|left|divorced) me\b"
           r"(?!\s+(?:a|an|the|some|alone|with|in|at|on|to)\b)", r"\bmy ex(?:-(?:%s|fianc[eé]e?)|\s+(?:%s))?,?\s+" % (_PARTNER, _PARTNER) + _N)
_told_rule("home", True, _I + r"(?:'ve| have)?\s+(?:just |recently |finally )?(?:moved|relocated) (?:out of|away from|from) "
           r"(?P<value>[^,.;!?]+?)(?:(?=\s+to\b)|" + _STOP + ")")
_TEAM_OF = r"(?:on|in|part of|a member of) " + _TEAM
_told_rule("team", False, _I + r"(?:'m| am|'ve been| have been)\s+(?:now |still |currently |also )?" + _TEAM_OF,
           _I + r"\s+(?:currently |still |now )?(?:work|am working|'m working) (?:on|in) " + _TEAM,
           _I + r"(?:'ve| have)?\s+(?:just |recently |finally )?(?:joined|(?:moved|switched|transferred) " + _FROM + "to) " + _TEAM)
_told_rule("team", True, _I + r"(?:'m| am) (?:no longer|not) " + _TEAM_OF, _I + r"(?:'m| am) (?:now )?off " + _TEAM,
           _I + r"(?:'ve| have| was| got|'ve been| have been)?\s+(?:just |recently |finally )?(?:left|quit|"
           r"(?:moved|switched|transferred|taken) (?:off|out of|away from|from)) " + _TEAM)


# "Please forget that I live in Lisbon", "delete the memory that I like jazz", "don't remember
# that I ...": the clause that follows is to be retracted, not learned. Not "don't forget that
# ...", "I forget that ...", "did you forget that ..." (reminders, not requests).
_FORGET = re.compile(
    r"(?i)(?<!\bnot )(?<!n't )(?<!\bnever )(?<!\bever )(?<!\bI )(?<!\bwe )(?<!\bdid you )(?<!\bdo you )"
    r"\b(?:forget|delete|erase|remove|wipe|unlearn|(?:do not|don't|stop|no longer) (?:remember|remembering|storing|keeping))"
    r"(?:\s+(?:the|that|this|my|your|any)\s+(?:memory|memories|fact|note|record|entry|info|information)"
    r"(?:\s+(?:of|about|saying|that))?)?(?:\s+(?:the fact that|that|about))?"
    r"\s+(?=I\b|I'm\b|I've\b|my\b|where I (?:live|work)\b)")
# What "forget where I live" names: the slot, whatever its value.
_FORGET_SLOT = (("where i live", "location", "home", "Lives in"), ("where i work", "work", "employer", "Works at"),
                ("my name", "identity", "name", "Name"))


def _parts(sentence: str) -> Iterator[tuple[str, bool]]:
    """``sentence`` in pieces, each with True when it is what the user asks to be forgotten."""
    pos = 0
    for m in _FORGET.finditer(sentence):
        if m.start() < pos:
            continue
        end = m.end() + len(re.split(r"[,;:]", sentence[m.end():], maxsplit=1)[0])
        yield sentence[pos:m.start()], False
        yield sentence[m.end():end], True
        pos = end
    yield sentence[pos:], False


def _forgotten(clause: str, turn: TurnRecorded) -> Iterator[CandidateFact]:
    """The user's request to forget ``clause``: an explicit retraction of each fact it states, as of now."""
    for phrase, category, attribute, text in _FORGET_SLOT:
        if re.match(phrase + r"\b(?! is)", clause, re.I):
            yield _fact(text, category, attribute, "", negated=True)
    for rule in _RULES:
        for m in rule.pattern.finditer(clause):
            for c in rule.build(m, turn):
                if not c.negated:  # forgetting a retraction asserts nothing we can store
                    yield replace(c, negated=True, explicit=True, valid_at=None)


# A vocative at the start of the answer: "Nice to meet you, Dana!", "Sure thing, Dana."
_GREETING = re.compile(r"^(?:(?i:[a-z' ]{1,30}),\s+|(?i:hi|hello|hey|thanks|welcome back)\s+)(?P<value>%s(?:-%s)?)\s*[!.,?]"
                       % ((_UP + _LETTER + "++",) * 2))


class OfflineExtractor:
    """Rule-based ``ExtractionClient``."""

    model_id = "offline-rules-v1"

    async def extract(self, turn: TurnRecorded) -> Sequence[CandidateFact]:
        return extract_facts(turn)


def extract_facts(turn: TurnRecorded) -> list[CandidateFact]:
    found: dict[tuple[str, str, bool], CandidateFact] = {}
    for sentence in re.split(r"(?<=[.!?])\s+|\n+", turn.user_message):
        said = [replace(c, evidence=c.evidence or part.strip()) for part, forget in _parts(sentence)
                for c in (_forgotten(part, turn) if forget else (
                    c for rule in _RULES for m in rule.pattern.finditer(part) for c in rule.build(m, turn)))]
        ended = {(c.attribute, c.value.casefold()) for c in said if c.negated}
        for c in said:  # "My dog Rex died": that he is gone, not that the user has him
            if c.negated or (c.attribute, c.value.casefold()) not in ended:
                found.setdefault((c.attribute, c.value.casefold(), c.negated), c)
    greeting = _GREETING.match(turn.assistant_message.strip())  # inferred: the user never said it
    if greeting and greeting.group("value") not in _NOT_NAMES and not any(k[0] == "name" for k in found):
        name = greeting.group("value")
        found[("name", name.casefold(), False)] = replace(
            _fact(f"Name is {name}", "identity", "name", name, explicit=False, confidence=0.6),
            evidence=greeting.group(0))
    return list(found.values())


class StrictOfflineExtractor:
    """The same rules, keeping only explicit, high-confidence candidates (a second extractor
    version to backfill and compare with ``memstream reform``)."""

    model_id = "offline-rules-v1-strict"

    async def extract(self, turn: TurnRecorded) -> Sequence[CandidateFact]:
        return [c for c in extract_facts(turn) if c.explicit and c.confidence >= 0.9]


class OfflineResolver:
    """Slot-based ``ResolutionClient``: same attribute and same value is a NOOP, a new value of a
    single-valued attribute an UPDATE, a negation a DELETE, anything else an ADD."""

    model_id = "offline-slots-v1"

    async def resolve(self, candidate: CandidateFact, neighbours: Sequence[ExistingFact]) -> Resolution:
        return resolve_fact(candidate, neighbours)

    async def resolve_all(self, asked: Sequence[tuple[CandidateFact, Sequence[ExistingFact]]]) -> list[Resolution]:
        return [resolve_fact(c, n) for c, n in asked]


def resolve_fact(candidate: CandidateFact, neighbours: Sequence[ExistingFact]) -> Resolution:
    same_slot = [n for n in neighbours if n.attribute == candidate.attribute]
    same_value = [n for n in same_slot if n.value.casefold() == candidate.value.casefold()]
    if candidate.negated:
        # Without a value ("I no longer have a dog"): the one its text names ("Has a dog named Rex"), or the only one.
        named = [n for n in same_slot if n.text.casefold().startswith(candidate.text.casefold())] or same_slot
        target = (same_value or [None])[0] if candidate.value else (
            named[0] if len(named) == 1 or (named and single_valued(candidate.attribute)) else None)
        if target is None:
            return Resolution(Operation.NOOP, None, f"nothing current to retract for {candidate.attribute}")
        return Resolution(Operation.DELETE, target.fact_id, f"user says {target.text!r} is no longer true")
    if same_value:
        return Resolution(Operation.NOOP, same_value[0].fact_id, "already known")
    if same_slot and single_valued(candidate.attribute):
        old = same_slot[0]
        return Resolution(Operation.UPDATE, old.fact_id, f"{candidate.attribute} changed: {old.value!r} -> {candidate.value!r}")
    return Resolution(Operation.ADD, None, "new fact")
