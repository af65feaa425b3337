"""Deprecated: ``memstream.sealing`` moved to ``memstream.keys`` (docs/upgrading.md). Kept for one release."""
from __future__ import annotations

import warnings

from memstream.keys import DataKeys, Kek, KekUnavailable, KmsKek, LocalKek, NotSealed, Shredded, WrongKek, data_keys, kek_for  # noqa: F401

warnings.warn("memstream.sealing is deprecated: import from memstream.keys", DeprecationWarning, stacklevel=2)
