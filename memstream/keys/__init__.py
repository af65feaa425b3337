"""The keys of crypto-shredding: each user's personal content is sealed with a data key of their
own (AES-256-GCM), data keys are kept wrapped by a key-encryption key, and forgetting a user
destroys their data key — every record sealed with it, on any log or backup, is then noise.

``kek``: the key-encryption keys; ``data_keys``: the per-user data keys; ``wrapped``: where they
are kept; ``rotation``: moving them to a new KEK. Records are sealed and opened with these keys by
``memstream.streams.log.sealing`` (docs/erasure.md)."""
from __future__ import annotations

from pathlib import Path

from memstream.keys.kek import Kek, KekUnavailable, KmsKek, LocalKek
from memstream.keys.data_keys import DataKeys, NotSealed, Shredded, WrongKek
from memstream.keys.wrapped import PostgresWrappedKeys

__all__ = ["DataKeys", "Kek", "KekUnavailable", "KmsKek", "LocalKek", "NotSealed", "Shredded", "WrongKek", "data_keys",
           "kek_for"]


def kek_path(kek: str, home: Path) -> Path | None:
    """Where a local key-encryption key's files are: "local" is ``<home>/keys/kek``."""
    if kek == "local":
        return Path(home) / "keys" / "kek"
    return Path(kek.removeprefix("file:")) if kek.startswith("file:") else None


def kek_for(kek: str, home: Path, retire_days: int = 7) -> Kek:
    """The key-encryption key a ``Settings.kek`` names."""
    if (path := kek_path(kek, home)) is not None:
        return LocalKek(path)
    import boto3

    return KmsKek(boto3.client("kms"), kek.removeprefix("kms:"), retire_days)


async def data_keys(settings, pool) -> DataKeys:
    """The deployment's data keys, in ``settings.keys_schema`` of ``pool``'s database. A local
    key-encryption key is made on first use only while the store is empty: a process started
    elsewhere (another ``MEMSTREAM_HOME``) must not make a second one."""
    store = PostgresWrappedKeys(pool, settings.keys_schema)
    await store.migrate()
    path = kek_path(settings.kek, settings.home)
    if path is not None and not LocalKek.exists(path) and await store.holds_keys():
        raise WrongKek(f"no key-encryption key at {path.resolve()}, but {settings.keys_schema} holds data keys "
                       "wrapped by one: run this process with the deployment's MEMSTREAM_HOME and MEMSTREAM_KEK "
                       "(or restore the files)")
    return await DataKeys(kek_for(settings.kek, settings.home, settings.kek_retire_days), store).ready()
