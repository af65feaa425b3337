"""Graphiti's (Zep's open-source core) ``Graphiti.search``, timed on its embedded Kuzu driver with
memstream's embedder.

Runs from the peers venv (``make bench-peers``). Builds a Kuzu graph with one heavy user
(``group_id = "heavy"``, 10k fact edges) plus filler users from graphiti's own ``EntityNode`` /
``EntityEdge`` objects with precomputed embeddings (``add_episode`` needs an LLM; see ``load`` for
why Kuzu ``COPY`` writes them). Then times ``graphiti.search(q, group_ids=["heavy"],
num_results=10)``, the query embedding included.

What it runs (graphiti_core/search/search.py with ``EDGE_HYBRID_SEARCH_RRF``): embed the query,
then two queries gathered concurrently on Kuzu (whose driver runs one query at a time):
BM25 over the ``RelatesToNode_`` full-text index (``QUERY_FTS_INDEX`` on name + fact, top 2k over
all users, then ``e.group_id IN $group_ids``), and an exact cosine scan
(``array_cosine_similarity(e.fact_embedding, $v) > 0.6`` on the group's edges, top 2k; no vector
index on this path); then reciprocal-rank fusion and the top k. No cross-encoder and no LLM: both
are stand-ins that raise if called.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from importlib.metadata import version

import kuzu
import numpy as np

from common import HEAVY, K, interleaved, pcts, users_plan
from memstream.bench.read import ORGS, PEOPLE, PLACES, QUESTIONS, T0, THINGS, Corpus
from memstream.config import Settings
from memstream.embedding import default_embedder

os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")  # read when graphiti is imported
os.environ.setdefault("EMBEDDING_DIM", "384")

from graphiti_core import Graphiti  # noqa: E402
from graphiti_core.cross_encoder.client import CrossEncoderClient  # noqa: E402
from graphiti_core.driver.kuzu_driver import KuzuDriver  # noqa: E402
from graphiti_core.edges import EntityEdge  # noqa: E402
from graphiti_core.embedder.client import EmbedderClient  # noqa: E402
from graphiti_core.graph_queries import get_fulltext_indices  # noqa: E402
from graphiti_core.llm_client.client import LLMClient  # noqa: E402
from graphiti_core.nodes import EntityNode  # noqa: E402
from graphiti_core.search.search_filters import SearchFilters  # noqa: E402
from graphiti_core.search.search_utils import edge_fulltext_search, edge_similarity_search  # noqa: E402

log = logging.getLogger("bench.peers.graphiti")
NAMES = PLACES + ORGS + THINGS + PEOPLE


class MemstreamEmbedder(EmbedderClient):
    """Graphiti embedder backed by memstream's offline int8 MiniLM; records the last call's time."""

    def __init__(self, embedder):
        self._embedder = embedder
        self.last_ms = 0.0

    async def create(self, input_data):
        text = input_data[0] if isinstance(input_data, list) else input_data
        t = time.perf_counter()
        vec = self._embedder.embed([text])[0].tolist()
        self.last_ms = (time.perf_counter() - t) * 1000
        return vec

    async def create_batch(self, input_data_list):
        return self._embedder.embed(list(input_data_list)).tolist()


class NoLLM(LLMClient):
    """Search must not call the LLM."""

    def __init__(self):
        super().__init__(None)

    async def _generate_response(self, *args, **kwargs):
        raise RuntimeError("graphiti called its LLM during the benchmark")


class NoCrossEncoder(CrossEncoderClient):
    async def rank(self, query, passages):
        raise RuntimeError("graphiti called its cross-encoder during the benchmark")


def _ts(at) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S") if at else ""


def _floats(vecs: np.ndarray) -> list[str]:
    buf = io.StringIO()
    np.savetxt(buf, vecs, fmt="%.7g", delimiter=",")
    return ["[" + line + "]" for line in buf.getvalue().splitlines()]


def load(driver: KuzuDriver, embedder, corpus: Corpus, plan, home: str) -> float:
    """Per user: a 'the user' node, one node per name the facts mention, one fact edge per row.

    Rows are built as graphiti's own ``EntityNode``/``EntityEdge`` objects and written, with their
    embeddings, in the layout of graphiti's Kuzu schema and bulk writer (``add_nodes_and_edges_bulk``
    stores an edge as ``(source)-[:RELATES_TO]->(:RelatesToNode_)-[:RELATES_TO]->(target)``), but
    with Kuzu's ``COPY``: graphiti's writer runs one MERGE per edge (~18 ms each here).
    """
    t = time.perf_counter()
    names = NAMES + ["the user"]
    name_vecs = embedder.embed(names)
    files = {k: open(os.path.join(home, f"{k}.csv"), "w", newline="") for k in ("entity", "edge", "out", "in")}
    out = {k: csv.writer(f) for k, f in files.items()}
    nodes = {}
    for user, _ in plan:
        nodes[user] = {name: EntityNode(name=name, group_id=user, labels=["Entity"], created_at=T0) for name in names}
        for node, vec in zip(nodes[user].values(), _floats(name_vecs)):
            out["entity"].writerow([node.uuid, node.name, user, "[Entity]", _ts(node.created_at), vec, "", "{}"])
    owners, idx = interleaved(plan, len(corpus.fact_texts))
    for j, (user, i, vec) in enumerate(zip(owners, idx, _floats(corpus.noisy(corpus.fact_vecs, idx)))):
        _, attribute, text = corpus.fact_texts[i]
        target = next((nm for nm in NAMES if nm in text), "the user")
        at = T0 + timedelta(seconds=j)
        e = EntityEdge(uuid=str(uuid.uuid5(uuid.NAMESPACE_OID, f"graphiti/{j}")), group_id=user,
                       source_node_uuid=nodes[user]["the user"].uuid, target_node_uuid=nodes[user][target].uuid,
                       name=attribute.upper(), fact=text, episodes=[], created_at=at, valid_at=at)
        out["edge"].writerow([e.uuid, user, _ts(e.created_at), e.name, e.fact, vec, "[]", _ts(e.expired_at),
                              _ts(e.valid_at), _ts(e.invalid_at), _ts(e.reference_time), json.dumps(e.attributes)])
        out["out"].writerow([e.source_node_uuid, e.uuid])
        out["in"].writerow([e.uuid, e.target_node_uuid])
    for f in files.values():
        f.close()
    conn = kuzu.Connection(driver.db)
    conn.execute(f"COPY Entity FROM '{home}/entity.csv' (header=false, parallel=false)")
    conn.execute("MATCH (n:Entity) SET n.summary = ''")  # COPY reads an empty field as NULL; graphiti writes ''
    conn.execute(f"COPY RelatesToNode_ FROM '{home}/edge.csv' (header=false, parallel=false)")
    conn.execute(f"COPY RELATES_TO FROM '{home}/out.csv' (from='Entity', to='RelatesToNode_', header=false)")
    conn.execute(f"COPY RELATES_TO FROM '{home}/in.csv' (from='RelatesToNode_', to='Entity', header=false)")
    for q in get_fulltext_indices(driver.provider):  # graphiti's own FTS definitions, built once loaded
        conn.execute(q)
    conn.close()
    return time.perf_counter() - t


async def run(args) -> dict:
    embedder = MemstreamEmbedder(default_embedder(args.threads))
    home = tempfile.mkdtemp(prefix="graphiti-bench-")
    report: dict = {"graphiti_core": version("graphiti-core"), "kuzu": version("kuzu"),
                    "embedder": embedder._embedder.model_id, "embed_threads": args.threads, "top_k": K,
                    "search_config": "EDGE_HYBRID_SEARCH_RRF"}
    try:
        driver = KuzuDriver(db=os.path.join(home, "graph.kuzu"))
        graphiti = Graphiti(graph_driver=driver, llm_client=NoLLM(), embedder=embedder, cross_encoder=NoCrossEncoder())
        plan = users_plan(args.rows, args.heavy, args.users)
        report["load_s"] = round(load(driver, embedder._embedder, Corpus(embedder._embedder), plan, home), 1)
        rows, _, _ = await driver.execute_query("MATCH (e:RelatesToNode_) RETURN e.group_id = $g AS heavy, count(*) AS n",
                                                g=HEAVY)
        report["edges"] = sum(r["n"] for r in rows)
        report["heavy_edges"] = sum(r["n"] for r in rows if r["heavy"])
        report["users"] = len(plan)

        async def search(q: str):
            return await graphiti.search(q, group_ids=[HEAVY], num_results=K)

        for i in range(args.warmup):
            await search(QUESTIONS[i % len(QUESTIONS)])
        totals, embeds, returned = [], [], []
        for i in range(args.calls):
            t = time.perf_counter()
            edges = await search(QUESTIONS[i % len(QUESTIONS)])
            totals.append((time.perf_counter() - t) * 1000)
            embeds.append(embedder.last_ms)
            returned.append(len(edges))
        # Per question, each leg alone (each asks for 2k): rows for the heavy user and time.
        legs: dict[str, tuple[list[int], list[float]]] = {"bm25": ([], []), "cosine": ([], [])}
        for q in QUESTIONS:
            vec = await embedder.create([q])
            for leg, call in (("bm25", edge_fulltext_search(driver, q, SearchFilters(), [HEAVY], 2 * K)),
                              ("cosine", edge_similarity_search(driver, vec, None, None, SearchFilters(), [HEAVY], 2 * K))):
                t = time.perf_counter()
                legs[leg][0].append(len(await call))
                legs[leg][1].append((time.perf_counter() - t) * 1000)
        report["search"] = {"search_ms": pcts(totals), "embed_ms_p50": round(float(np.median(embeds)), 2),
                            "returned_mean_of_10": round(float(np.mean(returned)), 2), "returned_min": int(min(returned)),
                            "leg_rows_asked": 2 * K}
        for leg, (rows, ms) in legs.items():
            report["search"][f"{leg}_rows_mean"] = round(float(np.mean(rows)), 2)
            report["search"][f"{leg}_ms_p50"] = round(float(np.median(ms)), 2)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=50_000, help="fact edges in the graph, all users")
    p.add_argument("--heavy", type=int, default=10_000, help="fact edges of the heavy user")
    p.add_argument("--users", type=int, default=300, help="users (group ids), the heavy one included")
    p.add_argument("--calls", type=int, default=240, help="timed searches")
    p.add_argument("--warmup", type=int, default=36)
    p.add_argument("--threads", type=int, default=Settings.from_env().read_embed_threads,
                   help="embedder threads (default: memstream's read path setting)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("graphiti_core").setLevel(logging.WARNING)
    report = asyncio.run(run(args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        r = report["search"]
        print(f"graphiti  p50 {r['search_ms']['p50']:7.2f}  p95 {r['search_ms']['p95']:7.2f}  "
              f"p99 {r['search_ms']['p99']:7.2f} ms   returned {r['returned_mean_of_10']:5.2f}/10   "
              f"bm25 rows {r['bm25_rows_mean']:5.1f}, cosine rows {r['cosine_rows_mean']:5.1f} of {r['leg_rows_asked']}")
        print(f"edges {report['edges']} ({report['heavy_edges']} heavy, {report['users']} users), "
              f"load {report['load_s']} s")
    return report


if __name__ == "__main__":
    main()
