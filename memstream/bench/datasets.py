"""Public benchmarks fetched at run time (never shipped or committed): where they live and how
``eval run`` finds them. BEAM has no licence file; LoCoMo is CC BY-NC."""
from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger("memstream.eval")

# dataset -> (git repository, the paths checked out, what ``eval run`` reads inside the clone).
# BEAM's 1M and 10M chats are left out: gigabytes no set here uses (100K is the held-out set,
# 500K the dev set).
DATASETS = {
    "beam": ("https://github.com/mohammadtavakoli78/BEAM.git", ["chats/100K", "chats/500K"], "chats"),
    "locomo": ("https://github.com/snap-research/LoCoMo.git", ["data/locomo10.json"], "data/locomo10.json"),
}


def fetch(dataset: str, into: Path, source: str | None = None) -> Path:
    """Clone ``dataset``'s repository (or ``source``: another URL, a local repository, or a
    directory holding its files) into
    ``into/<dataset>`` unless it is there, unpack what needs it, and return the path to evaluate:
    BEAM's ``chats`` directory (``chats/500K`` and ``chats/100K`` are its sets) or LoCoMo's file."""
    url, paths, inner = DATASETS[dataset]
    dest = Path(into) / dataset
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        origin = source or url
        if Path(origin, paths[0]).exists():  # a copy of the repository's files, already checked out
            for inside in paths:
                copy = shutil.copytree if Path(origin, inside).is_dir() else shutil.copyfile
                Path(tmp, inside).parent.mkdir(parents=True, exist_ok=True)
                copy(Path(origin, inside), Path(tmp, inside))
        else:
            if Path(origin).exists():  # a local repository: --depth needs a URL
                origin = Path(origin).resolve().as_uri()
            _git("clone", "--no-checkout", "--depth", "1", "--quiet", origin, str(tmp))
            _git("-C", str(tmp), "checkout", "HEAD", "--", *paths)
        tmp.rename(dest)
        log.info("fetched %s into %s", dataset, dest)
    return dest / inner


def _git(*args: str) -> None:
    done = subprocess.run(["git", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"git {args[0] if args[0] != '-C' else args[2]} failed: {done.stderr.strip()}")
