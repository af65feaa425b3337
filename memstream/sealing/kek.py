"""Key-encryption keys: what wraps each user's data key, so a stolen key store is useless
without it. The contract is ``Kek``; a local file by default, AWS KMS in production."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Protocol

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from memstream.schemas.errors import Retryable


class KekUnavailable(Retryable):
    """The key-encryption key cannot wrap or unwrap (missing, wrong, or its service refused):
    nothing sealed can be read or written until it is back. Never a reason to skip a record."""


class Kek(Protocol):
    """``wrap(data_key, user_id)`` returns an opaque blob that only ``unwrap(blob, user_id)`` by the
    same key-encryption key turns back into ``data_key``; the user id is bound to the blob
    (authenticated), so one user's wrapped key cannot be passed off as another's. ``kek_id``
    names the key-encryption key, stored beside every blob it made."""

    kek_id: str

    def wrap(self, data_key: bytes, user_id: str) -> bytes: ...

    def unwrap(self, blob: bytes, user_id: str) -> bytes: ...


class LocalKek:
    """A 256-bit key in a file (created 0600 on first use, under ``MEMSTREAM_HOME`` by default).
    Back the file up apart from the key store: either alone reads nothing."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Written aside, then linked in: a process starting alongside never reads half a key.
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(AESGCM.generate_key(bit_length=256))
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        key = self.path.read_bytes()
        if len(key) != 32:
            raise KekUnavailable(f"{self.path} is not a 256-bit key-encryption key ({len(key)} bytes)")
        self._aead = AESGCM(key)
        # Named by a fingerprint, not the file: a process with another key file is told so.
        self.kek_id = f"local:{hashlib.sha256(b'memstream-kek-id' + key).hexdigest()[:16]}"

    def wrap(self, data_key: bytes, user_id: str) -> bytes:
        nonce = os.urandom(12)
        return nonce + self._aead.encrypt(nonce, data_key, user_id.encode())

    def unwrap(self, blob: bytes, user_id: str) -> bytes:
        from cryptography.exceptions import InvalidTag

        try:
            return self._aead.decrypt(blob[:12], blob[12:], user_id.encode())
        except InvalidTag:
            raise KekUnavailable(f"a data key of this user does not open with {self.kek_id}") from None


class KmsKek:
    """An AWS KMS key (``key_id``: its id, ARN or alias) through boto3: ``Encrypt`` and ``Decrypt``
    with the user id as encryption context, so KMS itself refuses a blob under another user."""

    def __init__(self, client, key_id: str):
        self._kms, self._key = client, key_id
        self.kek_id = f"kms:{key_id}"

    def wrap(self, data_key: bytes, user_id: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self._kms.encrypt(KeyId=self._key, Plaintext=data_key,
                                     EncryptionContext={"memstream_user": user_id})["CiphertextBlob"]
        except (BotoCoreError, ClientError) as exc:
            raise KekUnavailable(f"KMS could not wrap a data key with {self._key}: {exc}") from exc

    def unwrap(self, blob: bytes, user_id: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self._kms.decrypt(CiphertextBlob=blob, KeyId=self._key,
                                     EncryptionContext={"memstream_user": user_id})["Plaintext"]
        except (BotoCoreError, ClientError) as exc:
            code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else type(exc).__name__
            raise KekUnavailable(f"KMS could not unwrap a data key of this user: {code}") from exc
