"""Embeddings from a service: ``/v1/embeddings`` of a real llama.cpp server (the 135M SmolLM2 in
embedding mode: 576 dimensions, mean-pooled; another model than MiniLM, to prove the plumbing),
and the stores taking the dimension of the configured embedder — made for it while empty, refused
once they hold another's vectors, and a model switched by a reform and a replay into a new schema
that the workers and readers then run on."""
from __future__ import annotations

import numpy as np
import pytest

from memstream.embedding import dimensions_of
from memstream.embedding import remote
from memstream.embedding.remote import OpenAIEmbedder
from memstream.projections.db import DimensionMismatch, drop_schema, migrate
from memstream.read_client import MemoryReader
from memstream.stack import model_server
from memstream.streams.ops.reform import reform
from memstream.streams.log.producer import TurnLog
from memstream.streams.ops.replay import replay

from .conftest import HOME, wait_until
from .test_formation import append_and_wait, turn

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def embedding_model():
    if model_server.answers(model_server.EMBED_PORT):
        if (found := model_server.serving(model_server.EMBED_PORT)) != "smollm2-135m":
            pytest.fail(f"port {model_server.EMBED_PORT} serves {found or 'something else'}, not smollm2-135m: "
                        "stop it (an eval's model server) and run the tests again")
        yield f"http://127.0.0.1:{model_server.EMBED_PORT}/v1"
        return
    proc = model_server.start("smollm2-135m", HOME / "models", model_server.EMBED_PORT, embedding=True,
                              log_path=HOME / "model-server.log")
    try:
        yield f"http://127.0.0.1:{model_server.EMBED_PORT}/v1"
    finally:
        model_server.stop(proc)


def on_service(settings, url):
    return settings.model_copy(update={"embedder": "openai", "embedding_base_url": url, "embedding_model": "smollm2"})


async def test_the_service_embeds_each_text_alike_normalised_in_order(embedding_model, monkeypatch):
    # Requests of 8 texts: two of them here. (A long text cut to fit is test_minilm_served's: a
    # whole 2,048-token window takes this model 10 s on two cores, MiniLM's 256 a fraction of one.)
    monkeypatch.setattr(remote, "BATCH", 8)
    e = OpenAIEmbedder(embedding_model, None, "smollm2")
    asked, ask = [], e._ask
    e._ask = lambda batch: asked.append(len(batch)) or ask(batch)
    texts = [f"I live in city number {n}." for n in range(11)] + [""]
    v = e.embed(texts)
    assert asked == [8, 4]
    assert (e.dim, e.model_id) == (576, "openai:smollm2:576") and v.shape == (12, 576) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    again = e.embed([texts[7], texts[3]])
    assert np.allclose(again, v[[7, 3]], atol=1e-5)  # a function of the text, whatever shares the call


async def test_an_empty_store_takes_the_embedders_dimension_and_a_full_one_refuses_another(settings, dsn, conn, workers,
                                                                                          embedding_model):
    s = on_service(settings, embedding_model)
    assert dimensions_of(s) == 576 and dimensions_of(settings) == 384
    schema = settings.postgres_schema + "_d576"
    try:
        assert "vectors of 576 dimensions" in await migrate(dsn, schema, 576)
        dims = await conn.fetch("SELECT c.relname, a.atttypmod FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
                                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND a.attname = "
                                "'embedding' AND c.relkind = 'p'", schema)
        assert {r["relname"]: r["atttypmod"] for r in dims} == {"episodes": 576, "episode_passages": 576,
                                                                 "memory_facts": 576, "memory_edges": 576}
        hnsw = await conn.fetchval("SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexdef LIKE '%hnsw%'",
                                   schema)
        assert hnsw >= 4  # rebuilt on the new columns
        assert await migrate(dsn, schema, 576) == []  # nothing to do again
    finally:
        await drop_schema(dsn, schema)
    # The test's own schema holds MiniLM's vectors once a turn is formed: another dimension is refused.
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("d", "I live in Oslo.", 0)])
    with pytest.raises(DimensionMismatch, match="384-dimensional.*makes 576.*reform"):
        await migrate(dsn, settings.postgres_schema, 576)


async def test_a_model_is_switched_by_a_reform_and_a_replay_into_a_new_schema_the_workers_then_run_on(
        settings, dsn, conn, workers, embedding_model):
    """The way docs/models.md gives: reform the log with the new embedder into a decisions version of
    its own, replay it into a new schema (its vector columns made for the new dimension), then run
    the workers and readers on that version: they form new turns with the new model and read them."""
    w = workers()
    await w.wait_assigned()
    await append_and_wait(settings, conn, [turn("emb", "I live in Lisbon and I love jazz.", 0),
                                           turn("emb", "My dog is called Rex.", 1)])
    w.stop()
    topic, new = settings.events_topic.replace("events", "smollm2.decisions"), settings.postgres_schema + "_smollm2"
    s = on_service(settings, embedding_model)
    try:
        done = await reform(s, extractor="offline", topic=topic)
        assert done.reformed_events == 2
        await replay(s, dsn, new, ["episodes", "facts", "graph", "commands"], topic=topic)
        models = {r["embedding_model"] for r in await conn.fetch(f"SELECT embedding_model FROM {new}.episodes")}
        assert models == {"openai:smollm2:576"}
        live = s.model_copy(update={"decisions_topic": topic, "postgres_schema": new})
        w2 = workers(settings=live)
        await w2.wait_assigned()
        async with TurnLog(live) as log:
            await log.append(turn("emb", "I started working at Globex.", 2))
        # Each projection applies the new turn's decisions on its own: wait for the one asked about.
        model = await wait_until(lambda: conn.fetchval(
            f"SELECT embedding_model FROM {new}.memory_facts WHERE user_id = 'emb' AND value = 'Globex'"),
            timeout=90, what="the new turn's fact in the new version")
        assert model == "openai:smollm2:576"
        await wait_until(lambda: conn.fetchval(f"SELECT count(*) = 3 FROM {new}.episodes WHERE user_id = 'emb'"),
                         timeout=90, what="the new turn's episode in the new version")
        reader = await MemoryReader.connect(live, dsn)
        try:
            ctx = await reader.read("emb", "c1", "what is my dog called?")
            assert any("Rex" in e.user_message for e in ctx.episodes)
            assert {f.text for f in ctx.facts} >= {"Lives in Lisbon"}
        finally:
            await reader.close()
    finally:
        await drop_schema(dsn, new)
