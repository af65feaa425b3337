"""The formation role's consolidation sweeps on a timer (``decay_sweep_every_s``,
``reflect_sweep_every_s``): each worker sweeps the users of the events partitions it owns, as of
its own clock, and records the sweep for those partitions."""
from __future__ import annotations

import logging
from datetime import datetime, timezone

log = logging.getLogger("memstream.sweep")


async def sweep(runtime, kind: str) -> None:
    """A ``decay`` or ``reflection`` sweep (``streams.worker.sweeping``, ``reflecting``) as of
    now, of the users of the events partitions ``runtime``'s consumer is assigned."""
    from memstream.streams.worker import reflecting, sweeping

    settings = runtime.settings
    mine = sorted(tp.partition for tp in runtime.app.consumer.assignment() if tp.topic == settings.events_topic)
    if not mine or getattr(runtime, "pool", None) is None or runtime.embedding_model is None:
        return
    at = datetime.now(timezone.utc)
    if kind == "decay":  # listing nothing: no one reads a timer's sweep, so no words of anyone's are read
        await sweeping.sweep(settings, runtime.pool, at=at, mine=mine, listing=False)
    else:
        await reflecting.sweep(settings, runtime.pool, at=at, model=runtime.embedding_model, mine=mine, listing=False)


def sweep_on_timer(app, runtime, kind: str, every: float) -> None:
    """Run ``kind``'s sweep every ``every`` seconds; a failed one is logged and tried next time."""
    async def timed():
        try:
            await sweep(runtime, kind)
        except Exception:  # consolidation, not the pipeline: the next interval tries again
            log.warning("the %s sweep failed", kind, exc_info=True)

    timed.__name__ = timed.__qualname__ = f"{kind}_sweep"  # Faust names a timer by its function
    app.timer(interval=every)(timed)
