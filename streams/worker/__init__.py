"""The running worker: its runtime (``runtime``), position gate, projection steps, the ingress
step and formation. ``memstream.streams.worker`` was a module before it was this package: its
names are looked up lazily here, with a deprecation warning, for one release."""
from __future__ import annotations

import warnings

_MOVED = {"run_worker": "memstream.streams.worker.runtime", "Runtime": "memstream.streams.worker.runtime",
          "ROLES": "memstream.streams.worker.runtime"}


def __getattr__(name: str):
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    warnings.warn(f"memstream.streams.worker.{name} is deprecated: import it from {_MOVED[name]}",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(_MOVED[name]), name)
