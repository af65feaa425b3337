"""Deprecated: ``memstream.streams.sealing`` moved to ``memstream.streams.log.sealing`` (docs/upgrading.md). Kept for one release."""
from __future__ import annotations

import warnings

from memstream.streams.log.sealing import RecordSealer, is_sealed, kept_plain, sealer_for  # noqa: F401

warnings.warn("memstream.streams.sealing is deprecated: import from memstream.streams.log.sealing", DeprecationWarning, stacklevel=2)
