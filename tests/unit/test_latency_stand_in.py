"""The hosted-model stand-in: the offline answers, late, throttled past a quota, and metered."""
import asyncio
import statistics
import time
from datetime import datetime, timezone

import pytest

from memstream.llm.latency import Latency, Meter, latent_clients
from memstream.llm.offline import OfflineExtractor
from memstream.llm.protocols import Throttled
from memstream.schemas import TurnRecorded

TURN = TurnRecorded.new(user_id="u", conversation_id="c", user_message="I moved to Berlin and I work at Acme Corp.",
                        assistant_message="Nice!", occurred_at=datetime(2026, 5, 1, tzinfo=timezone.utc))


def test_latencies_follow_the_p50_and_p95_asked_for():
    latency = Latency(0.8, 2.0, seed=1)
    draws = sorted(latency.draw() for _ in range(20_000))
    assert statistics.median(draws) == pytest.approx(0.8, rel=0.05)
    assert draws[int(0.95 * len(draws))] == pytest.approx(2.0, rel=0.08)
    assert {Latency(0.3).draw() for _ in range(5)} == {0.3}
    with pytest.raises(ValueError):
        Latency(1.0, 0.5)


async def test_answers_are_the_offline_ones_late_and_counted_as_bedrock_would_report_them():
    meter = Meter()
    extractor, resolver, relations, turn = latent_clients(Latency(0.05), meter)
    t = time.perf_counter()
    got = await asyncio.gather(*(extractor.extract(TURN) for _ in range(20)))
    assert time.perf_counter() - t < 0.5  # side by side, not one after another (20 x 0.05 s)
    offline = list(await OfflineExtractor().extract(TURN))
    assert all(g == offline for g in got)
    both = await turn.extract_turn(TURN)
    assert [f.value for f in both.facts] == [f.value for f in got[0]] and both.relations
    assert meter.calls == 21 and meter.most_in_flight == 20
    assert meter.input_tokens > 21 * 100 and meter.output_tokens > 21 * 10  # the prompt, tool schema and answer
    assert extractor.tokens[0] + turn.tokens[0] == meter.input_tokens  # each client counts its own
    assert extractor.tokens[1] + turn.tokens[1] == meter.output_tokens


async def test_past_its_quota_a_call_is_throttled_and_retried_with_backoff():
    meter = Meter()
    extractor, *_ = latent_clients(Latency(0.05, max_in_flight=2), meter)
    got = await asyncio.gather(*(extractor.extract(TURN) for _ in range(6)))
    assert len(got) == 6 and meter.calls == 6 and meter.throttled > 0 and meter.most_in_flight <= 2
    line = extractor._line
    with pytest.raises(Throttled):
        meter.in_flight = 2  # the quota taken by calls elsewhere
        await line.call({}, [])


async def test_the_demo_script_costs_at_most_one_and_a_half_calls_a_turn():
    from memstream.bench.formation import calls_per_turn
    from memstream.demo import script_turns

    counted = await calls_per_turn(script_turns(3))
    assert counted["calls_per_turn"] <= 1.5 < counted["calls_per_turn_before"], counted
