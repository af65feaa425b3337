"""Deprecated: ``memstream.dead_letters`` moved to ``memstream.streams.ops.dead_letters`` (docs/upgrading.md). Kept for one release."""
from __future__ import annotations

import warnings

from memstream.streams.ops.dead_letters import Letter, letter, letters, retry  # noqa: F401

warnings.warn("memstream.dead_letters is deprecated: import from memstream.streams.ops.dead_letters", DeprecationWarning, stacklevel=2)
