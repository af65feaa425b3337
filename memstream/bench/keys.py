"""``memstream bench keys``: what erasure costs the key store. A forget's destroy (the row's
wrapped key set to NULL and the table vacuumed at once) against a store of N users' keys, and
a KEK rotation wrapping all of them again. Self-contained: its own key schema and KEK files,
both dropped at the end."""
from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from memstream.projections.db import create_pool
from memstream.keys.kek import LocalKek
from memstream.keys.data_keys import DataKeys
from memstream.keys.wrapped import PostgresWrappedKeys
from memstream.keys.rotation import rotate


async def run_keys_bench(settings, dsn: str, *, users: int = 100_000, forgets: int = 200) -> dict:
    schema = f"k_bench_{uuid.uuid4().hex[:8]}"
    home = Path(tempfile.mkdtemp(prefix="memstream-bench-kek-"))
    pool = await create_pool(dsn, settings.postgres_schema, min_size=1, max_size=4)
    try:
        store = PostgresWrappedKeys(pool, schema)
        await store.migrate()
        keys = await DataKeys(LocalKek(home / "kek"), store).ready()
        names = [f"bench-user-{i}" for i in range(users)]
        started = time.perf_counter()
        for i in range(0, users, 1000):
            await asyncio.gather(*[keys.seal(u, b"x", "bench") for u in names[i:i + 1000]])
        made_s = time.perf_counter() - started
        ms = []
        for u in names[:forgets]:
            await keys.stamp(u, b"f" * 16)
            t = time.perf_counter()
            await keys.destroy(u)
            ms.append((time.perf_counter() - t) * 1000)
        ms.sort()
        started = time.perf_counter()
        rotation = await rotate(keys)
        rotate_s = time.perf_counter() - started
        started = time.perf_counter()
        await store.vacuum()  # the rotation's last step again, alone: how long the table is locked
        vacuum_s = time.perf_counter() - started
        return {"users": users, "forgets": forgets, "keys_made_per_s": round(users / made_s),
                "destroy_ms": {"p50": round(ms[len(ms) // 2], 2), "p95": round(ms[int(len(ms) * 0.95)], 2)},
                "rotate_s": round(rotate_s, 1), "rewrapped": rotation.rewrapped,
                "rewrapped_per_s": round(rotation.rewrapped / rotate_s), "vacuum_full_s": round(vacuum_s, 2)}
    finally:
        await pool.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await pool.close()
        shutil.rmtree(home, ignore_errors=True)
