"""What the keyword channel searches for: the names, IDs and numbers in a message — the things
embeddings blur ("Kyoto", "Project Hail Mary", "INV-2291") — not its common words, which the
vector channels already cover and which would make a full-text scan touch most of a heavy
user's rows."""
from __future__ import annotations

import re

_TOKEN = re.compile(r"[A-Za-z][\w'-]*|\d[\w./-]*")
# Words that open a sentence or a request with a capital letter without being a name.
_OPENERS = frozenset("""
what where when who whom whose how why which do did does is are was were will would can could should shall
may might must have has had tell remind show give list find please any anything some the a an my our your
i i'm i've i'd i'll hi hello hey thanks thank ok okay so and but or if then also just yes no let let's
""".split())


# Far more than the keyword search uses (its first 32 distinct words): a pasted document of
# names stops here instead of being scanned whole on the read path.
MAX_KEYWORD_TERMS = 256


def keyword_terms(message: str) -> list[str]:
    """Capitalised words that are not sentence openers, words with inner capitals or digits,
    and numbers; in order, without repeats, the first ``MAX_KEYWORD_TERMS``."""
    out: dict[str, None] = {}
    for m in _TOKEN.finditer(message):
        tok = m.group(0)
        name = tok[0].isupper() and tok.lower() not in _OPENERS
        coded = any(c.isdigit() for c in tok) or (len(tok) > 1 and any(c.isupper() for c in tok[1:]))
        if name or coded:
            out[tok] = None
            if len(out) == MAX_KEYWORD_TERMS:
                break
    return list(out)


# Words that ask about the present or the recent past: only then does a turn's age count for or
# against it. Otherwise an older turn that matches better is what was asked about.
_NOW = re.compile(r"\b(now|nowadays|currently|current|lately|latest|recent|recently|these days|this (?:week|month|"
                  r"year)|today|tonight|yesterday|last (?:time|night|week|month)|at the moment|anymore|so far|"
                  r"still|any more|newest|most recent)\b", re.IGNORECASE)


def asks_about_now(message: str) -> bool:
    """Whether ``message`` asks about now or lately ("what am I working on these days?")."""
    return _NOW.search(message) is not None
