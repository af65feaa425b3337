"""The memory inspector in a real browser: Debian's Chromium, headless, driven by Selenium
through chromedriver, against the API served on the real stack. Screenshots are kept under
``.memstream/screenshots/`` (README and docs show one)."""
from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import msgspec
import pytest

from memstream.api.app import create_app
from memstream.api.keys import ApiKeys
from memstream.demo import script_turns
from memstream.schemas import TurnRecorded, new_event_id
from memstream.streams.log.producer import TurnLog

from .conftest import served
from .helpers import turns

pytestmark = pytest.mark.asyncio

SHOTS = Path(__file__).resolve().parents[2] / ".memstream" / "screenshots"
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture
def browser():
    if not (CHROMIUM and DRIVER):  # make test's setup installs them (Makefile: system-deps)
        pytest.fail("the inspector's tests need Debian's chromium and chromium-driver: apt-get install chromium "
                    "chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1360,1800"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def until(driver, check, what: str, timeout: float = 30):
    """``check(driver)`` until it is truthy: a real page loads and redraws on its own time."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(check)
    except TimeoutException:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; the page says: "
                             f"{driver.find_element('id', 'notice').text!r}") from None


def edges(driver) -> frozenset[tuple[str, str]]:
    return frozenset((g.get_attribute("data-relation"), g.get_attribute("data-target"))
                     for g in driver.find_elements("css selector", "#graph g.edge"))


def as_of(driver) -> str:
    return driver.find_element("id", "graph-section").get_attribute("data-as-of")


def inspect_and_forget(driver, url: str, key: str) -> str:
    """What a person does in the inspector (in the browser, from a thread: the API serves on the
    test's event loop): returns the id of the fact they made it forget."""
    from selenium.webdriver.common.keys import Keys

    driver.get(f"{url}/docs")  # the API's own page renders too, from vendored assets
    until(driver, lambda d: len(d.find_elements("css selector", ".opblock")) > 10, "the API's operations listed")
    driver.get(f"{url}/inspector#key={key}&user=demo:maria")
    until(driver, lambda d: d.find_element("id", "user").get_attribute("data-loaded") == "demo:maria",
          "the user's memory loaded")
    assert key not in driver.current_url  # the key left the address bar for sessionStorage
    facts = driver.find_elements("css selector", "#facts tbody tr[data-fact-id]")
    texts = [f.text for f in facts]
    assert any("Berlin" in t for t in texts) and any("peanut" in t.lower() for t in texts), texts
    assert driver.find_elements("css selector", "#episodes .conversation")
    refused = [r.text for r in driver.find_elements("css selector", "#refused tbody tr[data-decision-id]")]
    assert any("Rome" in r and "hypothetical" in r for r in refused), refused
    now = edges(driver)
    assert now, "the graph drew no edges"

    # Why a fact is held: its versions, each with its decision and the turn it came from.
    home = next(f for f in facts if "· home" in f.text and "Berlin" in f.text)
    home.find_element("css selector", "button.history").click()
    versions = until(driver, lambda d: d.find_elements("css selector", "ol.versions li"), "the history")
    assert len(versions) >= 2 and "Lisbon" in versions[0].text and "decision " in versions[0].text, \
        [v.text for v in versions]
    assert driver.find_elements("css selector", "ol.versions blockquote")  # the source turn, quoted
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / "inspector.png"))

    # The date slider: the graph as it was on the first day, then back to now.
    slider = driver.find_element("id", "graph-slider")
    slider.send_keys(Keys.HOME)
    until(driver, lambda d: as_of(d) != "now", "the graph as of the first day")
    first = until(driver, lambda d: (edges(d),) if edges(d) != now else None, "an edge to change with the date")[0]
    assert first - now, f"no relationship of the first day had ended by now: {sorted(first)} / {sorted(now)}"
    driver.save_screenshot(str(SHOTS / "inspector-first-day.png"))
    slider.send_keys(Keys.END)
    until(driver, lambda d: as_of(d) == "now" and edges(d) == now, "the graph back to now")

    # Forget a fact: it leaves the page once the projections have applied it.
    row = next(f for f in driver.find_elements("css selector", "#facts tbody tr[data-fact-id]")
               if "peanut" in f.text.lower())
    fact_id = row.get_attribute("data-fact-id")
    forget = row.find_element("css selector", "button.forget")
    forget.click()
    assert "armed" in forget.get_attribute("class")  # a second click is needed: no undo
    # The turns that go with the fact are named before they go.
    until(driver, lambda d: "also forgets the" in d.find_element("id", "notice").text
          and "peanut" in d.find_element("id", "notice").text.lower(), "the turns that would go named")
    forget.click()
    until(driver, lambda d: not d.find_elements("css selector", f'tr[data-fact-id="{fact_id}"]')
          and "applied" in d.find_element("id", "notice").text, "the fact gone from the page")
    assert console_errors(driver) == []
    # Last (it opens the user again): a link from elsewhere never swaps the key of a signed-in page.
    driver.get(f"{url}/inspector#key=msk_someone_elses&user=demo:maria")
    until(driver, lambda d: "another key" in d.find_element("id", "notice").text, "the other key refused")
    assert driver.execute_script("return sessionStorage.getItem('memstream-key')") == key
    return fact_id


@contextlib.asynccontextmanager
async def inspecting(settings, dsn, tmp_path, turns):
    """``turns`` appended and projected, and the API served with a key of tenant ``demo``: yields
    its address, the key and a client holding it."""
    from memstream.embedding import default_embedder

    async with TurnLog(settings) as log:
        positions = await log.append_many(turns)
    keys = ApiKeys(tmp_path / "api-keys.json")
    key = keys.create("inspector test", tenant="demo")
    app = create_app(settings, keys=keys, dsn=dsn, embedder=default_embedder())
    async with served(app) as url, httpx.AsyncClient(base_url=url, timeout=30,
                                                     headers={"Authorization": f"Bearer {key}"}) as api:
        last = positions[-1]
        position = {"topic": last.topic, "partition": last.partition, "offset": last.offset}
        assert (await api.post("/v1/caught-up", json={"position": position, "timeout": 30})).json()["caught_up"]
        yield url, key, api


async def test_a_person_sees_their_memory_as_it_was_and_makes_it_forget(browser, settings, dsn, workers, tmp_path):
    w = workers()
    await w.wait_assigned()
    turns = [msgspec.structs.replace(t, user_id="demo:maria") for t in script_turns(1)]
    # Something the rules read and the junk guard refuses: shown under "Not kept", with why.
    turns.append(msgspec.structs.replace(turns[-1], event_id=new_event_id(), assistant_message="Usually not.",
                                         user_message="If I moved to Rome, would I need a visa?"))
    async with inspecting(settings, dsn, tmp_path, turns) as (url, key, api):
        fact_id = await asyncio.to_thread(inspect_and_forget, browser, url, key)
        # ... and the read.
        found = (await api.post("/v1/users/demo:maria/search", json={"query": "peanut allergy", "kinds": ["facts"]})).json()
        assert fact_id not in {f["fact_id"] for f in found["facts"]}
        ctx = (await api.post("/v1/users/demo:maria/context", json={"conversation_id": "c",
                                                                    "message": "what am I allergic to?"})).json()
        assert fact_id not in {f["fact_id"] for f in ctx["facts"]}


class _SlowFor:
    """ASGI wrapper: every API request for ``user`` answers ``delay`` seconds late."""

    def __init__(self, app, user: str, delay: float):
        self.app, self.needle, self.delay = app, b"/v1/users/" + quote(user, safe="").encode(), delay

    def __getattr__(self, name):
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("raw_path", b"").startswith(self.needle):
            await asyncio.sleep(self.delay)
        await self.app(scope, receive, send)


def switch_and_page(driver, url: str, key: str, slow: str, busy: str) -> None:
    driver.get(f"{url}/inspector#key={key}&user={quote(slow)}")
    until(driver, lambda d: d.find_element("id", "user-name").text == slow, "the slow user opened")
    driver.execute_script("openUser(arguments[0])", busy)  # before the slow user's replies are back
    until(driver, lambda d: d.find_element("id", "user").get_attribute("data-loaded") == busy, "the busy user loaded")
    time.sleep(2.5)  # the slow user's replies arrive meanwhile, and must be dropped
    said = [s.text for s in driver.find_elements("css selector", "#episodes .turn .said")]
    assert driver.find_element("id", "user-name").text == busy and len(said) == 100, said[:3]
    assert all(s.startswith("message ") for s in said), [s for s in said if not s.startswith("message ")][:3]
    assert driver.find_element("id", "user").get_attribute("data-loaded") == busy

    more = driver.find_element("css selector", "#episodes button.more")  # 101 turns: one page and one more
    assert "100 shown" in more.text
    more.click()
    until(driver, lambda d: len(d.find_elements("css selector", "#episodes .turn")) == 101
          and not d.find_elements("css selector", "#episodes button.more"), "the second page of episodes")
    assert driver.execute_script("return document.querySelector('#episodes-section h2').textContent") \
        .endswith("in UTC")
    assert console_errors(driver) == []


async def test_switching_users_never_shows_one_users_memory_under_anothers_and_a_big_memory_pages(
        browser, settings, dsn, workers, tmp_path):
    """A reply for the user opened first, arriving after the second was opened, is dropped; a
    user id holding "/" is one user to every route; more than a page of turns is reached."""
    from memstream.embedding import default_embedder

    slow, busy = "demo:slow", "demo:team/ana"
    w = workers()
    await w.wait_assigned()
    sent = [msgspec.structs.replace(t, user_id=busy) for t in turns(101, users=1, prefix="b")]
    sent += [TurnRecorded.new(user_id=slow, conversation_id="s", user_message="I am the slow one.",
                              assistant_message="ok.")]
    async with TurnLog(settings) as log:
        positions = await log.append_many(sent)
    keys = ApiKeys(tmp_path / "api-keys.json")
    key = keys.create("inspector test", tenant="demo")
    app = create_app(settings, keys=keys, dsn=dsn, embedder=default_embedder())
    async with served(_SlowFor(app, slow, 1.5)) as url, httpx.AsyncClient(
            base_url=url, timeout=30, headers={"Authorization": f"Bearer {key}"}) as api:
        for p in {p.partition: p for p in positions}.values():  # each partition's last
            seen = await api.post("/v1/caught-up", json={"position": {"topic": p.topic, "partition": p.partition,
                                                                      "offset": p.offset}, "timeout": 30})
            assert seen.json()["caught_up"], (p, seen.text)
        # The slashed id is one user to every route, not a route of another ("demo:team" + "/ana").
        overview = await api.get(f"/v1/users/{quote(busy, safe='')}")
        assert overview.status_code == 200 and overview.json()["stats"]["episodes"]["by_status"] == {"recorded": 101}
        assert overview.headers["cache-control"] == "no-store"
        await asyncio.to_thread(switch_and_page, browser, url, key, slow, busy)


async def test_a_reflection_shows_the_facts_and_turns_it_was_drawn_from(browser, settings, dsn, workers, tmp_path):
    from memstream.streams.ops.sweep import sweep_reflect

    from .test_formation import turn
    from .test_reflections import SOON

    w = workers()
    await w.wait_assigned()
    said = ["I like jazz.", "I like blues music.", "I like jazz.", "I like running by the river.",
            *(f"I went running by the river {when}." for when in ("this morning", "again today", "after work"))]
    turns = [msgspec.structs.replace(turn("max", s, i), user_id="demo:max") for i, s in enumerate(said)]
    async with inspecting(settings, dsn, tmp_path, turns) as (url, key, api):
        assert (await sweep_reflect(settings, dsn, at=SOON)).asking == 2

        async def reflections() -> int:
            page = (await api.get("/v1/users/demo:max/memories", params={"kind": "facts"})).json()
            return sum(f["category"] == "reflection" for f in page["items"])
        for _ in range(300):
            if await reflections() == 2:
                break
            await asyncio.sleep(0.1)
        assert await reflections() == 2, "the two reflections were not recorded within 30 s"

        def shown(driver) -> list[str]:
            driver.get(f"{url}/inspector#key={key}&user=demo:max")
            until(driver, lambda d: d.find_element("id", "user").get_attribute("data-loaded") == "demo:max",
                  "the user's memory loaded")
            drawn = [s.text for s in driver.find_elements("css selector", "#facts tbody tr .sources")]
            assert console_errors(driver) == []
            return drawn

        drawn = await asyncio.to_thread(shown, browser)
    # Each names its sources: the facts by what they say, the turns by how many (in either order).
    assert sorted(sorted(d.removeprefix("drawn from: ").split("; ")) for d in drawn) == \
        [["3 of your turns", "Likes running by the river"], ["Likes blues music", "Likes jazz"]], drawn
