"""Progress of long commands (replay, reform, export, import, benchmarks): a bar on a terminal
(tqdm), a plain line every few seconds otherwise (logs, CI). Library code reports through a
``(done, total)`` callback and never draws; the CLI makes the bar."""
from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from tqdm import tqdm

log = logging.getLogger("memstream.progress")

Report = Callable[[int, int], None]  # (done, total)


@contextmanager
def progress(what: str, unit: str = "records", every_s: float = 5.0, stream=None) -> Iterator[Report]:
    stream = stream or sys.stderr
    if stream.isatty():
        bar = tqdm(desc=what, unit=f" {unit}", unit_scale=True, file=stream, dynamic_ncols=True)

        def report(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        try:
            yield report
        finally:
            bar.close()
        return
    t0, last = time.monotonic(), [float("-inf")]  # the first report is written, however new the clock

    def lines(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] < every_s and done < total:
            return
        last[0] = now
        rate = done / (now - t0) if now > t0 else 0.0
        eta = f", ETA {(total - done) / rate:.0f} s" if rate and total > done else ""
        stream.write(f"{what}: {done:,}/{total:,} {unit} ({rate:,.0f}/s{eta})\n")
        stream.flush()

    yield lines
