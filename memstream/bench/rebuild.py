"""``memstream bench rebuild``: how long rebuilding the episodes projection from the log takes.

A fresh decisions topic gets ``episodes`` recorded episodes (``EpisodeRecorded``, each with its
384-d vector, sealed with its user's key as formation writes them; ``bench read``'s corpus) for
``users`` users; then
``streams.ops.rebuild`` rebuilds them into a fresh schema, timed per phase: reading and opening the
log, COPY, keyword postings, index builds, ANALYZE. ``compare_replay`` also times the
batch-by-batch ``replay`` of the same topic, for the ratio. Writing the topic is not timed.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timedelta, timezone

import numpy as np

from memstream.bench import discarded, prepared
from memstream.config import Settings

def _decisions(settings: Settings, n: int, users: int):
    """``n`` recorded episodes of ``bench read``'s corpus: template turns with real embeddings,
    each row's vector its text's with a little noise (clustered as a real store's are)."""
    from memstream.bench.read import Corpus
    from memstream.embedding import default_embedder, to_bytes
    from memstream.schemas import EpisodeRecorded, LogPosition

    embedder = default_embedder()
    corpus = Corpus(embedder)
    idx = np.random.default_rng(11).integers(0, len(corpus.episode_texts), n)
    vectors = corpus.noisy(corpus.episode_vecs, idx)
    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for i, (j, vector) in enumerate(zip(idx, vectors)):
        event = uuid.uuid5(uuid.NAMESPACE_URL, f"memstream-bench-rebuild/{i}")
        yield EpisodeRecorded(
            decision_id=uuid.uuid5(event, "episode"), source_event_id=event,
            source=LogPosition(settings.events_topic, i % settings.partitions, i // settings.partitions),
            recorded_at=base + timedelta(seconds=i), user_id=f"rebuild-{i % users}", conversation_id=f"c{i % users}",
            occurred_at=base + timedelta(seconds=i), user_message=corpus.episode_texts[j],
            assistant_message="Thanks for telling me.", metadata=None, embedding=to_bytes(vector),
            embedding_model=embedder.model_id)


async def _write(settings: Settings, pool, n: int, users: int) -> float:
    from memstream.keys import data_keys
    from memstream.streams.log.producer import idempotent_producer
    from memstream.streams.log.sealing import RecordSealer

    sealer = RecordSealer(await data_keys(settings, pool))
    producer = idempotent_producer(settings.kafka_bootstrap, max_batch_size=1024 * 1024)
    await producer.start()
    t = time.perf_counter()
    try:
        futures = []
        for d in _decisions(settings, n, users):
            futures.append(await producer.send(settings.decisions_topic, await sealer.seal(d), key=d.user_id.encode()))
            if len(futures) >= 5000:
                await asyncio.gather(*futures)
                futures = []
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.perf_counter() - t


async def run_rebuild_bench(base: Settings, *, episodes: int, users: int = 1000, compare_replay: bool = False,
                            on_progress=None) -> dict:
    from memstream.projections.db import create_pool
    from memstream.streams.ops.rebuild import rebuild_episodes
    from memstream.streams.ops.replay import replay

    settings, tag, dsn = await prepared(base, "rebuild")
    pool = await create_pool(dsn, settings.postgres_schema, max_size=1)
    into = settings.postgres_schema + "_rebuilt"
    try:
        write_s = await _write(settings, pool, episodes, users)
        report = await rebuild_episodes(settings, dsn, into, on_progress=on_progress)
        out = {"episodes": episodes, "users": users, "sealed": settings.seal_records, "write_topic_s": round(write_s, 1),
               **report.as_dict()}
        if compare_replay:
            replayed = await replay(settings, dsn, settings.postgres_schema + "_replayed", ["episodes"])
            out["replay_s"] = round(replayed.seconds, 1)
            out["replay_records_per_s"] = round(replayed.records_per_s, 1)
        return out
    finally:
        await pool.close()
        await discarded(settings, dsn, into, settings.postgres_schema + "_replayed")
