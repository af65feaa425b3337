"""The offline rules read the world's names (any script), greetings, and the common ways of saying
a pet, a friendship, a partner, a home or a team is gone, each ending only the one it names.

The sentences below were written before running them, apart from the rules (none is one the rules
were tuned on); the facts extractor and the relation extractor must agree on each."""
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from memstream.llm.offline import _NOT_NAMES, extract_facts, resolve_fact
from memstream.llm.offline_relations import _NOT_NAMES as _NOT_RELATION_NAMES, extract_relations
from memstream.llm.protocols import CandidateFact, ExistingFact, Operation
from memstream.schemas import TurnRecorded
from tests.unit.pipeline import Memory

AT = datetime(2026, 3, 15, 10, tzinfo=timezone.utc)

# --- held apart: written first -------------------------------------------------------------------

# (what the user says, the name fact and is_named alias)
NAMES = [
    ("my name is Şükrü, nice to meet you", "Şükrü"),
    ("Hello, I'm Nguyễn.", "Nguyễn"),
    ("You can call me Ἀθηνᾶ.", "Ἀθηνᾶ"),
    ("Hey all, I am Ольга and I have a question.", "Ольга"),
    ("My name is Ibrahim Çelik.", "Ibrahim Çelik"),
    ("Hi there! I'm Siobhán.", "Siobhán"),
    ("my name is 佐藤", "佐藤"),
    ("Call me Ярослав, please.", "Ярослав"),
    ("My name is עדי.", "עדי"),
    ("My name is Zoe\u0308.", "Zoe\u0308"),  # "ë" as "e" and a combining diaeresis
    ("Good morning, I'm Þórunn.", "Þórunn"),
    ("My name is अनन्या.", "अनन्या"),
]

# (what the user says, (attribute, value) of the fact, (relation, target) of the user's edge or None)
STATED = [
    ("My daughter Émilie turns 5 in June.", ("daughter", "Émilie"), ("has_child", "Émilie")),
    ("My cat is called Ñoño.", ("pet", "Ñoño"), ("has_pet", "Ñoño")),
    ("my brother Øystein lives in Bergen", ("brother", "Øystein"), ("has_sibling", "Øystein")),
    ("My girlfriend Anaïs is a nurse.", ("partner", "Anaïs"), ("married_to", "Anaïs")),
    ("My friend Đorđe is coming over.", ("friend", "Đorđe"), ("friend_of", "Đorđe")),
    ("I'm originally from Đà Nẵng.", ("origin", "Đà Nẵng"), None),
    ("We're heading to Île-de-France next month", ("trip", "Île-de-France"), None),
    ("I just moved to Malmö.", ("home", "Malmö"), ("lives_in", "Malmö")),
    ("I'm moving to Óbidos in May.", ("move", "Óbidos"), None),
    ("I joined Škoda last year.", ("employer", "Škoda"), ("works_at", "Škoda")),
    ("I live in A Coruña.", ("home", "A Coruña"), ("lives_in", "A Coruña")),
    ("I recently joined the Infra team.", ("team", "Infra team"), ("member_of", "Infra team")),
    ("I've been on the Payments team for two years.", ("team", "Payments team"), ("member_of", "Payments team")),
    ("My sister Мария is a teacher.", ("sister", "Мария"), ("has_sibling", "Мария")),
]

# A third person's job or home, in the relation extractor: (said, (source, relation, target)).
THIRD = [
    ("Ümit lives in Kayseri.", ("Ümit", "lives_in", "Kayseri")),
    ("Ángela works at Telefónica.", ("Ángela", "works_at", "Telefónica")),
]

# (what the assistant answers, the name it calls the user)
GREETINGS = [
    ("Welcome back, Åsa! What shall we do today?", "Åsa"),
    ("Hello Ștefan, here's the summary.", "Ștefan"),
    ("Great to see you, Joël.", "Joël"),
    ("Nice to meet you, Αλέξανδρος!", "Αλέξανδρος"),
]

# (what the user says, (attribute, value) that ended, (relation, target) of the edge that ended)
ENDED = [
    ("Our old parrot Kiwi passed away on Sunday.", ("pet", "Kiwi"), ("has_pet", "Kiwi")),
    ("Sadly our hamster, Nibbles, died.", ("pet", "Nibbles"), ("has_pet", "Nibbles")),
    ("Biscuit ran away last month.", ("pet", "Biscuit"), ("has_pet", "Biscuit")),
    ("We had to have Mochi put to sleep.", ("pet", "Mochi"), ("has_pet", "Mochi")),
    ("I rehomed my rabbit Clover.", ("pet", "Clover"), ("has_pet", "Clover")),
    ("My kitten Pip went missing two weeks ago", ("pet", "Pip"), ("has_pet", "Pip")),
    ("Priya and I aren't friends anymore.", ("friend", "Priya"), ("friend_of", "Priya")),
    ("I'm no longer friends with Jakub.", ("friend", "Jakub"), ("friend_of", "Jakub")),
    ("I had a falling out with my best friend Leila.", ("friend", "Leila"), ("friend_of", "Leila")),
    ("Marco and I stopped being friends years ago.", ("friend", "Marco"), ("friend_of", "Marco")),
    ("Me and Bogdan are not friends any more.", ("friend", "Bogdan"), ("friend_of", "Bogdan")),
    ("My husband Diego and I got divorced in 2019.", ("partner", "Diego"), ("married_to", "Diego")),
    ("Hannah broke up with me.", ("partner", "Hannah"), ("married_to", "Hannah")),
    ("I separated from my wife Inés last spring.", ("partner", "Inés"), ("married_to", "Inés")),
    ("Kai and I split up.", ("partner", "Kai"), ("married_to", "Kai")),
    ("I dumped my girlfriend Mia.", ("partner", "Mia"), ("married_to", "Mia")),
    ("I moved out of Berlin in March.", ("home", "Berlin"), ("lives_in", "Berlin")),
    ("Last year I moved away from Seattle.", ("home", "Seattle"), ("lives_in", "Seattle")),
    ("I relocated from Kraków to Gdańsk.", ("home", "Kraków"), ("lives_in", "Kraków")),
    ("I'm not on the Growth team anymore.", ("team", "Growth team"), ("member_of", "Growth team")),
    ("I was moved off the Search team.", ("team", "Search team"), ("member_of", "Search team")),
    ("I quit the Mobile team last week.", ("team", "Mobile team"), ("member_of", "Mobile team")),
    ("My dog Łatka died yesterday.", ("pet", "Łatka"), ("has_pet", "Łatka")),
    ("Søren and I are no longer friends.", ("friend", "Søren"), ("friend_of", "Søren")),
    # A second batch, written after the first one's two misses ("have Mochi put to sleep", "Me and
    # Bogdan") were fixed, and before running it.
    ("Our cat Simba was put down last Tuesday.", ("pet", "Simba"), ("has_pet", "Simba")),
    ("We gave away our puppy Bolt.", ("pet", "Bolt"), ("has_pet", "Bolt")),
    ("Nala passed on in her sleep.", ("pet", "Nala"), ("has_pet", "Nala")),
    ("We lost our dog Fido to cancer.", ("pet", "Fido"), ("has_pet", "Fido")),
    ("I fell out with Ewa last summer.", ("friend", "Ewa"), ("friend_of", "Ewa")),
    ("Me and Chidi had a falling out.", ("friend", "Chidi"), ("friend_of", "Chidi")),
    ("I'm divorced from Björn now.", ("partner", "Björn"), ("married_to", "Björn")),
    ("Aiko dumped me last night.", ("partner", "Aiko"), ("married_to", "Aiko")),
    ("My ex-husband Raúl still calls.", ("partner", "Raúl"), ("married_to", "Raúl")),
    ("Lena and I broke up in April.", ("partner", "Lena"), ("married_to", "Lena")),
    ("I moved away from Tromsø last year.", ("home", "Tromsø"), ("lives_in", "Tromsø")),
    ("I left the Billing team in January.", ("team", "Billing team"), ("member_of", "Billing team")),
    ("I'm no longer part of the Design team.", ("team", "Design team"), ("member_of", "Design team")),
]

# Said to a user whose pet is Rex, friend Sam, partner Ana, home Lisbon and team Data: none of
# these ends any of them (questions, hedges, someone else's, an ending only almost).
NOTHING_ENDED = [
    "My dog Rex died?",
    "Did Rex die?",
    "I'm not sure Sam and I are friends.",
    "My friend's dog died.",
    "Ana's dog died.",
    "My neighbour's cat Rex went missing.",
    "I dreamt that my dog Rex died.",
    "My dog Rex almost died last week.",
    "Sam and I are still friends.",
    "I'm worried Ana and I will break up.",
    "Ana and I split the bill.",
    "Ana left me a voicemail.",
    "I left the office early.",
    "I'm on the same team as Sam.",
    "We lost the match.",
    "Sam's brother and I fell out.",
    "I'm not friends with Sam's brother anymore.",
    "If Ana and I ever divorced, who would keep Rex?",
    "I moved out of my parents' place years ago.",
    "I'm not on the Data team yet.",
    # the second batch
    "Rex died in the movie we watched.",
    "Would Sam and I still be friends if I moved?",
    "My sister broke up with her boyfriend Tom.",
    "Sam's dog passed away.",
    "I hope Ana and I never split up.",
    "We almost lost Rex last year.",
    "I left Lisbon for a weekend trip.",
    "I'm thinking about leaving the Data team.",
    "Tell me if Sam and I are still friends.",
]

KNOWN = ["My dog Rex is asleep.", "My friend Sam is funny.", "My wife Ana is a chef.", "I live in Lisbon.",
         "I'm on the Data team."]
HELD = {("pet", "Rex"), ("friend", "Sam"), ("partner", "Ana"), ("home", "Lisbon"), ("team", "Data team")}
HELD_EDGES = {("has_pet", "Rex"), ("friend_of", "Sam"), ("married_to", "Ana"), ("lives_in", "Lisbon"),
              ("member_of", "Data team")}


# --- the checks ----------------------------------------------------------------------------------

def said(user: str, assistant: str = "Okay."):
    t = TurnRecorded.new(user_id="u", conversation_id="c", user_message=user, assistant_message=assistant, occurred_at=AT)
    return extract_facts(t), extract_relations(t)


@pytest.mark.parametrize("sentence, name", NAMES)
def test_a_name_in_any_script_is_read_whole_by_both_extractors(sentence, name):
    facts, relations = said(sentence)
    assert [(c.attribute, c.value, c.negated) for c in facts] == [("name", name, False)]
    assert [(r.relation, r.target) for r in relations] == [("is_named", name)]


@pytest.mark.parametrize("sentence, fact, edge", STATED)
def test_names_and_places_in_any_script_are_read_whole(sentence, fact, edge):
    facts, relations = said(sentence)
    assert (*fact, False) in {(c.attribute, c.value, c.negated) for c in facts}, facts
    if edge is not None:
        assert ("I", *edge, False) in {(r.source, r.relation, r.target, r.negated) for r in relations}, relations


@pytest.mark.parametrize("sentence, triple", THIRD)
def test_a_third_persons_name_in_any_script_is_a_source(sentence, triple):
    assert triple in {(r.source, r.relation, r.target) for r in said(sentence)[1]}


@pytest.mark.parametrize("answer, name", GREETINGS)
def test_the_assistant_greeting_the_user_by_a_name_in_any_script(answer, name):
    facts, _ = said("Can you help me plan the week?", answer)
    assert [(c.attribute, c.value, c.explicit) for c in facts] == [("name", name, False)]


@pytest.mark.parametrize("sentence, fact, edge", ENDED)
def test_an_ending_names_the_one_that_ended_in_both_extractors(sentence, fact, edge):
    facts, relations = said(sentence)
    assert (*fact, True) in {(c.attribute, c.value, c.negated) for c in facts}, facts
    assert (*fact, False) not in {(c.attribute, c.value, c.negated) for c in facts}  # not that it is held
    assert ("I", *edge, True) in {(r.source, r.relation, r.target, r.negated) for r in relations}, relations
    assert ("I", *edge, False) not in {(r.source, r.relation, r.target, r.negated) for r in relations}


# The issue's own examples (the rules were written from these: not held apart).
@pytest.mark.parametrize("sentence, fact, edge", [
    ("My dog Rex died last week", ("pet", "Rex"), ("has_pet", "Rex")),
    ("We lost our cat Luna", ("pet", "Luna"), ("has_pet", "Luna")),
    ("Rex passed away", ("pet", "Rex"), ("has_pet", "Rex")),
    ("we had to put Rex down", ("pet", "Rex"), ("has_pet", "Rex")),
    ("we gave our cat Luna away", ("pet", "Luna"), ("has_pet", "Luna")),
    ("Sam and I are no longer friends", ("friend", "Sam"), ("friend_of", "Sam")),
    ("I'm not friends with Sam anymore", ("friend", "Sam"), ("friend_of", "Sam")),
    ("I fell out with Sam", ("friend", "Sam"), ("friend_of", "Sam")),
    ("My wife Ana and I divorced", ("partner", "Ana"), ("married_to", "Ana")),
    ("I divorced Ana", ("partner", "Ana"), ("married_to", "Ana")),
    ("Ana and I broke up", ("partner", "Ana"), ("married_to", "Ana")),
    ("I broke up with my boyfriend Tom", ("partner", "Tom"), ("married_to", "Tom")),
    ("I split up with Tom", ("partner", "Tom"), ("married_to", "Tom")),
    ("I moved out of Lisbon", ("home", "Lisbon"), ("lives_in", "Lisbon")),
    ("I moved away from Porto", ("home", "Porto"), ("lives_in", "Porto")),
    ("I left the Platform team", ("team", "Platform team"), ("member_of", "Platform team")),
    ("I'm no longer on the Data team", ("team", "Data team"), ("member_of", "Data team")),
])
def test_the_issues_endings(sentence, fact, edge):
    test_an_ending_names_the_one_that_ended_in_both_extractors(sentence, fact, edge)


@pytest.mark.parametrize("sentence, name", [("My name is Zoë", "Zoë"), ("Hi, I'm Zoë", "Zoë"), ("Hello! I am Ørjan", "Ørjan"),
                                            ("Hey there, I'm Ana", "Ana"), ("My name is Дмитрий.", "Дмитрий"),
                                            ("Call me Αλέξανδρος.", "Αλέξανδρος"), ("My name is 张伟。", "张伟")])
def test_the_issues_names(sentence, name):
    test_a_name_in_any_script_is_read_whole_by_both_extractors(sentence, name)
    assert said("Hm.", "Nice to meet you, Zoë!")[0][0].value == "Zoë"


def held(memory: Memory) -> tuple[set, set]:
    facts = {(r.attribute, r.value) for r in memory.facts.values() if r.current}
    edges = {(e.relation, e.target_value or memory.graph.rows["u", e.target_entity_id].name)
             for rel in ("has_pet", "friend_of", "married_to", "lives_in", "member_of") for e in memory.edges(rel)
             if e.current}
    return facts, edges


def knowing() -> Memory:
    memory = Memory()
    for n, sentence in enumerate(KNOWN):
        memory.say(sentence, AT + timedelta(days=n))
    return memory


@pytest.mark.parametrize("sentence", NOTHING_ENDED)
def test_a_question_a_hedge_or_someone_elses_loss_ends_nothing(sentence):
    memory = knowing()
    before = held(memory)
    assert HELD <= before[0] and HELD_EDGES <= before[1], before
    memory.say(sentence, AT + timedelta(days=30))
    after = held(memory)
    assert HELD <= after[0] and HELD_EDGES <= after[1], (sentence, after)


@pytest.mark.parametrize("sentence, gone", [
    ("My dog Rex died last week.", ("pet", "Rex", "has_pet")),
    ("Sam and I are no longer friends.", ("friend", "Sam", "friend_of")),
    ("My wife Ana and I divorced.", ("partner", "Ana", "married_to")),
    ("I moved out of Lisbon.", ("home", "Lisbon", "lives_in")),
    ("I left the Data team.", ("team", "Data team", "member_of")),
])
def test_an_ending_ends_only_the_one_it_names(sentence, gone):
    memory = knowing()
    memory.say("My cat Luna is asleep. My friend Łukasz is funny. I'm on the Platform team.", AT + timedelta(days=10))
    memory.say(sentence, AT + timedelta(days=30))
    facts, edges = held(memory)
    attribute, value, relation = gone
    assert (attribute, value) not in facts and (relation, value) not in edges, (facts, edges)
    others = (HELD | {("pet", "Luna"), ("friend", "Łukasz"), ("team", "Platform team")}) - {(attribute, value)}
    assert others <= facts, facts
    assert {(r, v) for r, v in HELD_EDGES if v != value} | {("has_pet", "Luna"), ("friend_of", "Łukasz")} <= edges


def cand(attribute, value, text, negated=True):
    return CandidateFact(text=text, category="relationship", attribute=attribute, value=value, confidence=0.9,
                         explicit=True, negated=negated)


def existing(n, attribute, value, text):
    import uuid
    return ExistingFact(uuid.UUID(int=n), text, "relationship", attribute, value, 0.8)


def test_a_negation_with_a_value_deletes_that_value_only():
    rex, luna = existing(1, "pet", "Rex", "Has a dog named Rex"), existing(2, "pet", "Luna", "Has a cat named Luna")
    r = resolve_fact(cand("pet", "Rex", "Has a pet named Rex"), [luna, rex])
    assert (r.op, r.target) == (Operation.DELETE, rex.fact_id)
    assert resolve_fact(cand("pet", "Max", "Has a pet named Max"), [luna, rex]).op is Operation.NOOP


def test_a_negation_without_a_value_deletes_only_the_one_its_words_name():
    rex, luna = existing(1, "pet", "Rex", "Has a dog named Rex"), existing(2, "pet", "Luna", "Has a cat named Luna")
    r = resolve_fact(cand("pet", "", "Has a dog"), [luna, rex])
    assert (r.op, r.target) == (Operation.DELETE, rex.fact_id)
    assert resolve_fact(cand("pet", "", "Has a parrot"), [luna, rex]).op is Operation.NOOP  # which one? neither
    assert resolve_fact(cand("pet", "", "Has a parrot"), [luna]).op is Operation.DELETE  # the only one


# --- properties ----------------------------------------------------------------------------------

LETTERS = st.characters(categories=["Lu", "Ll", "Lo"])
# A capitalised first letter where the script has case ("Zoë", "Дмитрий"); any letter where it has not ("张伟").
FIRST = LETTERS.map(lambda c: c.upper() if len(c.upper()) == 1 else c).filter(lambda c: not c.islower())
WORDS = st.builds(str.__add__, FIRST, st.text(LETTERS, max_size=8))
NAMED = st.lists(WORDS, min_size=1, max_size=2).map(" ".join)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(NAMED)
def test_any_name_in_any_script_round_trips_through_both_extractors(name):
    assume(name not in _NOT_NAMES and name not in _NOT_RELATION_NAMES)
    facts, relations = said(f"My name is {name}.")
    assert [(c.attribute, c.value, c.negated) for c in facts] == [("name", name, False)]
    assert [(r.relation, r.target, r.negated) for r in relations] == [("is_named", name, False)]


@settings(max_examples=200, derandomize=True, deadline=None)
@given(NAMED)
def test_any_place_in_any_script_round_trips_to_the_home_and_lives_in(place):
    assume(place not in _NOT_RELATION_NAMES and place.split()[0].lower() not in ("the", "my"))
    facts, relations = said(f"I live in {place}.")
    assert [(c.attribute, c.value, c.negated) for c in facts] == [("home", place, False)]
    assert [(r.relation, r.target, r.negated) for r in relations] == [("lives_in", place, False)]
