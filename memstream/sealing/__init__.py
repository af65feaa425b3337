"""Sealing for crypto-shredding: each user's personal content is sealed with a data key of their
own (AES-256-GCM), data keys are kept wrapped by a key-encryption key, and forgetting a user
destroys their data key — every record sealed with it, on any log or backup, is then noise.

``kek``: the key-encryption keys; ``keys``: the per-user data keys. Records are sealed and
opened by ``memstream.streams.sealing`` (docs/erasure.md)."""
from __future__ import annotations

from pathlib import Path

from memstream.sealing.kek import Kek, KekUnavailable, KmsKek, LocalKek
from memstream.sealing.keys import DataKeys, NotSealed, PostgresWrappedKeys, Shredded

__all__ = ["DataKeys", "Kek", "KekUnavailable", "KmsKek", "LocalKek", "NotSealed", "Shredded", "data_keys", "kek_for"]


def kek_for(kek: str, home: Path) -> Kek:
    """The key-encryption key a ``Settings.kek`` names: "local" is ``<home>/keys/kek``."""
    if kek == "local":
        return LocalKek(Path(home) / "keys" / "kek")
    import boto3

    return KmsKek(boto3.client("kms"), kek.removeprefix("kms:"))


async def data_keys(settings, pool) -> DataKeys:
    """The deployment's data keys, in ``settings.keys_schema`` of ``pool``'s database."""
    store = PostgresWrappedKeys(pool, settings.keys_schema)
    await store.migrate()
    return DataKeys(kek_for(settings.kek, settings.home), store)
