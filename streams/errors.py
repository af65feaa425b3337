"""Deprecated: ``memstream.streams.errors`` moved to ``memstream.streams.log.errors`` (docs/upgrading.md). Kept for one release."""
from __future__ import annotations

import warnings

from memstream.streams.log.errors import BrokerUnavailable, Transient, as_retryable, retried  # noqa: F401

warnings.warn("memstream.streams.errors is deprecated: import from memstream.streams.log.errors", DeprecationWarning, stacklevel=2)
