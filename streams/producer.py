"""Deprecated: ``TurnLog`` lives in ``memstream.streams.log.producer``; hosts use ``memstream.connect()``.

Kept for one release so that hosts written against the old path keep running."""
from __future__ import annotations

import warnings

from memstream.streams.log.producer import TurnLog, idempotent_producer

warnings.warn("memstream.streams.producer is deprecated: use memstream.connect() (or memstream.streams.log.producer)",
              DeprecationWarning, stacklevel=2)

__all__ = ["TurnLog", "idempotent_producer"]
