"""The retrieval gate: a heuristic, no LLM. Trivial messages ("ok", "thanks!") skip the query
embedding and every Tier 2 channel; Tier 0/1, identity and due reminders are always read."""
from __future__ import annotations

import re

_TRIVIAL = frozenset("""
ok okay k kk yes yeah yep yup no nope nah sure fine cool nice great awesome perfect good thanks thank
thx ty you much lol haha hah hehe hi hello hey yo bye goodbye cya later night morning good got it sounds
alright right mhm hmm hm uh um oh ah wow welcome np noted understood agreed exactly indeed true done
please go ahead continue more so very a lot all again
""".split())
_WORD = re.compile(r"[a-z']+")


def needs_retrieval(message: str) -> bool:
    """False for greetings, acknowledgements and fillers of up to five words; True otherwise,
    and always for a question."""
    text = message.strip().lower()
    if "?" in text:
        return True
    words = _WORD.findall(text)
    if not words:
        return False  # emoji, punctuation, empty
    return not (len(words) <= 5 and all(w.strip("'") in _TRIVIAL for w in words))
