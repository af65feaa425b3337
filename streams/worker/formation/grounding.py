"""The junk guard: a candidate fact is stored only if the turn grounds it as something the user
said of themselves.

Every extractor — the offline rules, Bedrock, an OpenAI-compatible model — names the words of
the turn a candidate rests on (``evidence``). The guard reads those words in the turn, never the
model's word for them, and refuses the candidate when:

* the words are not in the user's message (``ungrounded``), or are only in the assistant's and
  the user did not confirm them (``assistant_only``);
* the sentence they are in asks (``question``) or asks for something (``request``), and they
  say nothing of the user ("can you recommend a good book?"; but "any tips for my trip to
  Lisbon?" still says the user is going);
* it supposes rather than says (``hypothetical``: "if I lived in Paris", "I might move");
* it says it in jest (``joke``: "just kidding", "yeah right");
* it is about someone else (``other_person``: "my sister is allergic to peanuts" is not the
  user's allergy) — a relationship of the user's stays theirs ("my sister is called Ana");
* the words are quoted: someone else's, which the user passes on (``quoted``);
* it is text the host or a prompt put in the turn (``prompt``: "You are a helpful assistant",
  "The user is a lawyer"), or memory memstream itself rendered and the host sent back (``echo``).

Pure and deterministic (rules on the turn's text): a refusal is recorded as a ``FactRefused``
decision with its kind and reason, so a replay never runs the guard again, and what it refused
is visible in the user's history. Model-agnostic by construction: it reads the turn, not the model.
"""
from __future__ import annotations

import functools
import re
import unicodedata
from typing import NamedTuple

from memstream.llm.protocols import CandidateFact
from memstream.schemas import TurnRecorded
from memstream.schemas.events import REFUSAL_KINDS

KINDS = REFUSAL_KINDS

_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*", re.UNICODE)
_CONFIRM = re.compile(r"^\W*(yes|yeah|yep|yup|right|correct|exactly|indeed|that'?s (right|correct|true)|true|sure is)\b",
                      re.IGNORECASE)
_QUESTION_START = re.compile(
    r"^\W*(can|could|would|will|do|does|did|is|are|was|were|should|shall|what|where|when|who|whom|whose|why|how|"
    r"which|any)\b", re.IGNORECASE)
_REQUEST = re.compile(
    r"^\W*(please\b|remind me\b|can you\b|could you\b|would you\b|will you\b|help me\b|tell me\b|recommend\b|"
    r"suggest\b|give me\b|find me\b|show me\b|write me\b|let me know\b|set (a|an) (reminder|alarm|timer)\b)",
    re.IGNORECASE)
_HYPOTHETICAL = re.compile(
    r"\b(if i\b|if only\b|what if\b|i would\b|i'd\b|i might\b|i may\b|maybe\b|perhaps\b|someday\b|some day\b|"
    r"one day\b|thinking (about|of)\b|considering\b|i wish\b|imagine\b|suppose\b|pretend\b|hypothetically\b|"
    r"in another life\b|dream of\b|not sure (if|whether)\b|wondering (if|whether)\b)", re.IGNORECASE)
# What takes a retraction back: not a "lol" after "I don't live there any more".
_KIDDING = re.compile(r"\bjust kidding\b|\bjk\b|\byeah,? right\b|\boh,? sure\b|\bas if\b|/s\b|😂|🙃|😜|"
                      # "Oh great, I love sweating through my shirt": delight opened by "oh" is mostly irony
                      r"^\W*oh\b[^.!?]{0,30}\b(love|adore|enjoy|can't wait|favourite|favorite)\b", re.IGNORECASE)
_JOKE = re.compile(_KIDDING.pattern + r"|\blol\b|\blmao\b|\bhaha\w*|\bnot really\b", re.IGNORECASE)
_SHOUTED = re.compile(r"\b(LOVE|ADORE|ENJOY|AMAZING|GREAT)\b")  # "I LOVE Monday meetings"
# Prompt injection anywhere in the message puts every fact of it in doubt.
_INJECTION = re.compile(r"(\bignore (all |the |any )?(previous|prior|above) (instructions|prompts?)\b|\bsystem prompt\b|"
                        r"<\|?(system|im_start)\|?>|\[inst\]|###\s*(instruction|system)\b|\bjailbreak\b|"
                        r"\bdeveloper mode\b)", re.IGNORECASE)
_OTHERS = ("sister", "brother", "mother", "mom", "mum", "father", "dad", "wife", "husband", "partner", "boyfriend",
           "girlfriend", "friend", "boss", "manager", "colleague", "coworker", "co-worker", "roommate", "flatmate",
           "neighbour", "neighbor", "son", "daughter", "kid", "kids", "child", "children", "cousin", "aunt", "uncle",
           "grandma", "grandmother", "grandpa", "grandfather", "niece", "nephew", "fiancé", "fiance", "fiancée",
           "teammate", "classmate", "teacher", "doctor", "parents", "family", "in-laws")
_SOMEONE = r"(you|they|he|she|someone|people|(my|our)\s+(\w+\s+){0,2}(%s))" % "|".join(map(re.escape, _OTHERS))
_REPORTED = re.compile(r"\b%s\s+(said|say|says|mentioned|told me|think|thought|assumed|guessed|wrote)\b" % _SOMEONE,
                       re.IGNORECASE)
# A quotation opened by a verb of saying ("My sister said: "I work at Google now""): the
# quoted words are the speaker's, whoever "I" is in them.
_SPEECH_BEFORE = re.compile(r"\b(said|says|say|told me|tells me|wrote|writes|asked|asks|texted|texts|replied|goes|went|"
                            r"posted|tweeted|yelled|shouted)\W*$", re.IGNORECASE)
# Words that turn what follows into its opposite ("I am not vegan", "I no longer live in Lisbon"),
# and "don't" (the words "don" and "t"); "hardly" too before the words, not between them.
_NEGATING = frozenset({"not", "no", "never", "nor", "neither", "without", "cannot"})
_NEGATION = re.compile(r"\b(%s|hardly)\b|n['’]t\b" % "|".join(sorted(_NEGATING)), re.IGNORECASE)
_OTHER_SUBJECT = re.compile(
    r"^\W*((my|our)\s+(\w+\s+){0,2}(%s)\b|(he|she|they|his|her|their)\b)" % "|".join(map(re.escape, _OTHERS)),
    re.IGNORECASE)
_FIRST_PERSON = re.compile(r"\b(i|i'm|i've|i'd|i'll|me|myself)\b", re.IGNORECASE)
_PROMPT = re.compile(
    r"(\byou are an? \w+|\bas an ai\b|\bsystem prompt\b|\bsystem:|\binstructions?:|<\|?(system|im_start)\|?>|\[inst\]|"
    r"###\s*(instruction|system)|\bthe user is\b|\bthe user('s| has| lives| works| likes)\b|\bact as\b|"
    r"\bignore (all |the )?previous\b)", re.IGNORECASE)
# What ``render_prompt`` writes: memory memstream rendered, sent back by the host as if said.
_ECHO = re.compile(r"(<memory>|</memory>|^\s*(known facts|profile|relationships|relevant past conversation|"
                   r"recent turns|due reminders|about the user \(from the host\)):)", re.IGNORECASE | re.MULTILINE)


_LABEL = re.compile(r"^\W*(user|assistant)\s*:\s*", re.IGNORECASE)
_MINE = re.compile(r"\b(my|our|mine|ours|we|we're|we've|us)\b", re.IGNORECASE)
_CLAUSE = re.compile(r"[,;:.!?\n]|\s(?:and|but|so|because)\s")  # where a clause ends
# An opening mark stops at the next opening one: a message of unclosed marks is read once, not
# once per mark.
_QUOTES = re.compile(r"\"[^\"]{8,}\"|“[^“”]{8,}”|(?<![A-Za-z])'[^']{8,}'(?![A-Za-z])|‘[^‘’]{8,}’")


@functools.lru_cache(maxsize=16)
def _quote_spans(text: str) -> tuple[tuple[int, int, bool], ...]:
    """Each quotation of ``text``: where it is, and whether a verb of saying opens it (read once
    per message however many candidates of it are checked)."""
    return tuple((m.start(), m.end(), bool(_SPEECH_BEFORE.search(text[max(0, m.start() - 40):m.start()])))
                 for m in _QUOTES.finditer(text))


def _quoted(text: str, at: int) -> bool:
    return any(a < at < b for a, b, _ in _quote_spans(text))


# A supposition governs a whole sentence ("Suppose I live in Paris but work in Berlin"); a hedge,
# only its own part of it ("I'm not sure if you remember, but I live in Lisbon now").
_SUPPOSING = re.compile(r"(?:^|[,;:(]\s*|\b(?:and|so|then)\s+)\W*if\b|\b(?:what if|suppose|supposing|imagine|pretend|"
                        r"hypothetically)\b", re.IGNORECASE)


def _hedged(sentence: str, at: int) -> bool:
    """Whether what ``sentence`` says at offset ``at`` is supposed rather than said."""
    cuts = [m for m in re.finditer(r"\bbut\b|;", sentence, re.IGNORECASE)]
    start = max((m.end() for m in cuts if m.end() <= at), default=0)
    end = min((m.start() for m in cuts if m.start() > at), default=len(sentence))
    return bool(_HYPOTHETICAL.search(sentence[start:end]) or _SUPPOSING.search(sentence[:start]))


def _reported_quote(said: str, start: int, end: int) -> bool:
    """Whether the words at ``said[start:end]`` take in a quotation opened by a verb of saying."""
    return any(a < end and start < b and saying for a, b, saying in _quote_spans(said))


def _asks(sentence: str, evidence: str) -> bool:
    """Whether the clause of ``sentence`` holding ``evidence`` asks: the sentence is a question
    and that clause is its last, or opens like one ("where is...", "can you...")."""
    at = max(0, _find(sentence, evidence))
    clauses = [(m.start(), m.end()) for m in re.finditer(r"[^,;:]+", sentence)]
    mine = next(((a, b) for a, b in clauses if a <= at < b), (0, len(sentence)))
    clause = sentence[mine[0]:mine[1]]
    return bool(_QUESTION_START.match(clause)) or (sentence.rstrip().endswith("?") and mine == clauses[-1])


SENTENCE_CHARS = 2_000  # of a run-on "sentence" (a pasted page), the part around the words read


def _sentence_at(text: str, at: int) -> tuple[str, int]:
    """The sentence of ``text`` holding offset ``at`` (at most ``SENTENCE_CHARS`` either side of
    it: the checks read what is near the words), and where that starts."""
    start, end = 0, len(text)
    for m in _SENTENCE.finditer(text):
        if m.start() <= at < m.end():
            start, end = m.start(), m.end()
            break
    start, end = max(start, at - SENTENCE_CHARS), min(end, at + SENTENCE_CHARS)
    return text[start:end], start


def _nfkc(text: str) -> str:
    # Every offset the guard takes is into text normalised once: NFKC changes lengths ("½",
    # decomposed accents), so an offset into the normalised text is not one into the raw.
    return unicodedata.normalize("NFKC", text)


class _Words(NamedTuple):
    """A text's words: where each is, casefolded, and joined by single spaces to search in."""
    at: tuple[re.Match, ...]
    said: tuple[str, ...]
    joined: str


@functools.lru_cache(maxsize=32)
def _words(text: str) -> _Words:
    at = tuple(re.finditer(r"\w+", text))
    said = tuple(m.group(0).casefold() for m in at)
    return _Words(at, said, " " + " ".join(said) + " ")


def _spans(haystack: str, needle: str, limit: int = 1) -> list[tuple[int, int]]:
    """Where ``needle``'s words are in ``haystack`` (both normalised), whole words in order, case,
    spacing, quotes and punctuation between them aside: at most ``limit`` places, first first. A
    search of one string in another, linear however long the quote or often its words repeat."""
    words = [w.casefold() for w in re.findall(r"\w+", needle)]
    if not words:
        return []
    text, wanted, out, at = _words(haystack), " " + " ".join(words) + " ", [], 0
    while len(out) < limit and (at := text.joined.find(wanted, at)) >= 0:
        first = text.joined.count(" ", 0, at + 1) - 1  # words before it
        out.append((text.at[first].start(), text.at[first + len(words) - 1].end()))
        at += 1
    return out


def _span(haystack: str, needle: str) -> tuple[int, int] | None:
    """The first of ``_spans``."""
    return next(iter(_spans(haystack, needle)), None)


def _find(haystack: str, needle: str) -> int:
    """Where ``_span`` finds ``needle`` starts (-1: nowhere)."""
    found = _span(haystack, needle)
    return found[0] if found else -1


# Words a model drops or adds when it quotes loosely ("I grew up in Kraków" for "Grew up in
# Kraków", "I am vegan" for "I'm vegan", "I work at Zalando" for "I work as an engineer at
# Zalando"): the rest must still be there, in order, close together.
_SLACK = frozenset({"i", "m", "im", "ve", "ll", "d", "re", "am", "is", "are", "was", "have", "has", "a", "an", "the",
                    "my", "me", "s", "and", "that", "to", "really", "also", "just", "so", "very"})


# Bounds on a loose match, whatever the turn repeats: evidence of more words must be quoted
# exactly (a model's quote is a phrase, not a page), and at most this many places a match may
# have reached are followed (the first; one past them may be missed, and refused: the safe way).
MAX_LOOSE_WORDS, MAX_LOOSE_ENDS = 48, 256


def _negating(text: str, token: re.Match) -> bool:
    word = token.group(0).casefold()
    # "don't" is the words "don" and "t": the "t" after "n'" negates.
    return word in _NEGATING or (word == "t" and text[max(0, token.start() - 2):token.start()].casefold() in
                                 ("n'", "n’"))


def _span_loosely(haystack: str, needle: str) -> tuple[int, int] | None:
    """Where ``needle``'s words other than ``_SLACK`` are in ``haystack``, whole words in order,
    at most five words apart, none of those between a negation ("I am vegan" is not in "I am not
    vegan") (None: nowhere, or no such word to go by). Word by word, each step looking at most
    six words on: linear in the text, whatever words repeat in it."""
    words = [w.casefold() for w in re.findall(r"\w+", needle) if w.casefold() not in _SLACK]
    if not words or len(words) > MAX_LOOSE_WORDS:
        return None
    tokens, said, _ = _words(haystack)
    # Where a match of the words so far can end, with the earliest start of one that ends there.
    if not (ends := {i: i for i, w in enumerate(said) if w == words[0]}):
        return None
    for word in words[1:]:
        nxt: dict[int, int] = {}
        for end, start in list(ends.items())[:MAX_LOOSE_ENDS]:
            for g in range(end + 1, min(end + 7, len(tokens))):
                if said[g] == word:
                    nxt[g] = min(nxt.get(g, start), start)
                elif _negating(haystack, tokens[g]):
                    break
        if not (ends := nxt):
            return None
    end, start = min(ends.items(), key=lambda e: (e[1], e[0]))
    return tokens[start].start(), tokens[end].end()


def _located(text: str, evidence: str) -> tuple[int, int] | None:
    return _span(text, evidence) or _span_loosely(text, evidence)


_SUBJECTS = frozenset({"i", "we", "my", "our", "me"})


def _negated_before(text: str, start: int, evidence: str) -> bool:
    """Whether the two words before ``text[start:]`` negate it, the evidence saying nothing of it
    ("I have never worked at Google" for "I have worked at Google"). Not before a subject: a
    negation there belongs to another clause ("I can't believe I live in Lisbon")."""
    if _NEGATION.search(evidence):
        return False
    first = re.match(r"\w+", text[start:])
    if first and first.group(0).casefold() in _SUBJECTS:
        return False
    clause = _CLAUSE.split(text[:start])[-1]
    return bool(_NEGATION.search(" ".join(re.findall(r"[\w'’]+", clause)[-2:])))


# A confirmation that takes nothing back: "Yes, born and raised!", not "Yes, but not me".
_QUALIFIED = re.compile(r"\b(but|not|no|never|except|although|though|however|actually|wrong)\b|n['’]t\b",
                        re.IGNORECASE)
_FILLER = r"^\W*(?:(?:so|and|oh|ah|ok|okay|then|wait|right|hmm)\W+)*"
# The assistant's sentence the user confirmed, in the second person: "So your sister is
# allergic to peanuts?" is about the sister; "Would you move to Paris if you could?" supposes.
_YOUR_OTHER_SUBJECT = re.compile(
    _FILLER + r"(your\s+(\w+\s+){0,2}(%s)\b|(he|she|they|his|her|their)\b)" % "|".join(map(re.escape, _OTHERS)),
    re.IGNORECASE)
_SUPPOSED_TO_YOU = re.compile(
    r"\b(if you\b|if only\b|what if\b|you would\b|you'd\b|would you\b|you might\b|you may\b|maybe\b|perhaps\b|"
    r"someday\b|some day\b|one day\b|imagine\b|suppose\b|pretend\b|hypothetically\b|you wish\b|dream of\b)",
    re.IGNORECASE)
_FORGET = re.compile(r"\b(forget|remove|delete|erase|scratch|disregard)\b", re.IGNORECASE)


def _confirmed(candidate: CandidateFact, said: str, reply: str, evidence: str) -> tuple[str, str] | None:
    """The guard for words only the assistant said: kept when the user plainly confirmed a
    sentence of the assistant's that states something of the user."""
    found = _located(reply, evidence)
    if found is None:
        return "ungrounded", "the words it rests on are not in the turn"
    if not _CONFIRM.match(said) or _QUALIFIED.search(said):
        return "assistant_only", "only the assistant said it, and the user did not plainly confirm it"
    sentence, _ = _sentence_at(reply, found[0])
    if _SUPPOSED_TO_YOU.search(sentence):
        return "hypothetical", "the user agreed to a supposition of the assistant's, not a fact"
    if _JOKE.search(sentence):
        return "joke", "the assistant's words the user agreed to were said in jest"
    if candidate.category != "relationship" and _YOUR_OTHER_SUBJECT.match(sentence):
        return "other_person", "the assistant's sentence the user confirmed is about someone else, not the user"
    return None


def refusal(candidate: CandidateFact, turn: TurnRecorded) -> tuple[str, str] | None:
    """``(kind, reason)`` if ``candidate`` must not be stored as the user's fact, else None."""
    # A model may copy the turn's speaker label with the words ("USER: I live in Lisbon").
    evidence = _LABEL.sub("", _nfkc(getattr(candidate, "evidence", None) or "").strip())
    if not evidence:
        return "ungrounded", "the extractor named no words of the turn this fact rests on"
    said = _nfkc(turn.user_message)
    found = _located(said, evidence)
    if found is None:
        return _confirmed(candidate, said, _nfkc(turn.assistant_message), evidence)
    at = found[0]
    if not candidate.negated and _negated_before(said, at, evidence):
        return "ungrounded", "the turn says the opposite: the words it rests on are negated there"
    if _ECHO.search(said):
        # Memory rendered by memstream, pasted back: facts in it were stored when they were said.
        return "echo", "the turn holds memory memstream rendered, sent back as if the user said it"
    if _INJECTION.search(said):
        return "prompt", "the message tries to instruct the model; nothing in it is taken as the user's word"
    if _quoted(said, at):
        return "quoted", "the words are quoted: someone else's, passed on by the user"
    sentence, base = _sentence_at(said, at)
    if _reported_quote(said, at, found[1]):
        return "quoted", "the words are a quotation of someone else's, passed on by the user"
    value = _nfkc(candidate.value or "")
    said_at = max(_find(sentence, value) if value else -1, _find(sentence, evidence))
    if said_at > 0 and _REPORTED.search(sentence[:said_at]):
        return "quoted", "the words are what someone else said or thought, reported by the user"
    if _PROMPT.search(sentence) or _PROMPT.search(evidence):
        return "prompt", "the words are instructions or a description put in the turn, not the user speaking"
    asked_to_forget = bool(_REQUEST.match(sentence) or _FORGET.search(sentence))
    if candidate.negated:
        # A retraction or a request to forget ("please forget that I live in Lisbon", "I'd like
        # you to delete that...") asks by nature, politely as it may; a question about one
        # ("should I quit Google?") retracts nothing.
        if asked_to_forget:
            # Polite as it may be ("I'd like you to forget..."): only a supposition before the
            # request, or a hedge in what it asks to forget, makes it one.
            verb = _FORGET.search(sentence)
            before, asked = (sentence[:verb.start()], sentence[verb.end():]) if verb else ("", sentence)
            if _SUPPOSING.search(before) or _HYPOTHETICAL.search(asked):
                return "hypothetical", "the user supposed taking it back rather than took it back"
            if candidate.category != "relationship" and _OTHER_SUBJECT.match(evidence):
                return "other_person", "the retraction is about someone else, not the user"
        elif _asks(sentence, evidence):
            return "question", "the user asked about taking it back; a question retracts nothing"
    else:
        about_user = _FIRST_PERSON.search(evidence) or _MINE.search(evidence)
        if not about_user and (_asks(sentence, evidence) or evidence.rstrip().endswith("?")):
            return "question", "the user asked it; a question states nothing"
        if not about_user and (_REQUEST.match(sentence) or _REQUEST.match(evidence)):
            return "request", "the user asked for something; a request states nothing about them"
    if not (candidate.negated and asked_to_forget) and _hedged(sentence, at - base):
        return "hypothetical", "the user supposed it rather than said it"
    if (_KIDDING if candidate.negated else _JOKE).search(sentence) or _SHOUTED.search(sentence):
        return "joke", "the user said it in jest"
    if candidate.category != "relationship" and _OTHER_SUBJECT.match(sentence) and not _FIRST_PERSON.search(
            sentence.split(",")[0]):
        return "other_person", "the sentence is about someone else, not the user"
    return None


# Relations to another person (or a pet): the user's own, though the sentence is about them.
_PERSONAL = frozenset({"married_to", "has_child", "has_sibling", "has_parent", "friend_of", "managed_by", "has_pet",
                       "knows"})


def edge_refusal(relation: str, target: str, negated: bool, turn: TurnRecorded) -> tuple[str, str] | None:
    """``refusal`` for an edge of the user's (``relation`` canonical); relation extractors name
    no words of the turn, so its ground is where the turn names ``target``: every sentence of the
    user's message naming it (one that asks, supposes, jokes or speaks of someone else refuses
    it), or else the assistant's words the user plainly confirmed. A target the turn does not
    name is the extractor's word for what it implies ("New York City" for "NYC"): kept if a
    sentence of the user's message grounds something of theirs."""
    if not re.search(r"\w", target):
        return "ungrounded", "the edge names no target"
    said, named = _nfkc(turn.user_message), _nfkc(target)
    starts = [a for a, _ in _spans(said, named, limit=8)]
    if not starts and (found := _span_loosely(said, named)):
        starts = [found[0]]

    def grounded(evidence: str) -> tuple[str, str] | None:
        return refusal(CandidateFact(text=target, category="relationship" if relation in _PERSONAL else "other",
                                     attribute=relation, value=target, confidence=1.0, explicit=True,
                                     negated=negated, evidence=evidence), turn)

    if starts:
        for sentence in dict.fromkeys(_sentence_at(said, at)[0] for at in starts):
            if (why := grounded(sentence)) is not None:
                return why
        return None
    if _located(_nfkc(turn.assistant_message), named):
        return grounded(target)  # the assistant's: kept only once the user plainly confirmed it
    whys = [grounded(m.group(0)) for m in _SENTENCE.finditer(said) if re.search(r"\w", m.group(0))][:16]
    return None if any(why is None for why in whys) else (whys[0] if whys else ("ungrounded", "the turn is empty"))
