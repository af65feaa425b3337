"""Key-encryption keys: what wraps each user's data key, so a stolen key store is useless
without it. The contract is ``Kek``; a local keyring by default, AWS KMS in production.

Rotation (``memstream.keys.rotation``) makes a new key-encryption key current, has every
data key that still exists wrapped again under it, and then retires the old one (its file
shredded; a KMS key scheduled for deletion): a copy of a destroyed data key left in an old WAL
segment, a replica or a backup was wrapped under a key that no longer exists."""
from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from memstream.schemas.errors import Retryable

log = logging.getLogger("memstream.keys")


class KekUnavailable(Retryable):
    """The key-encryption key cannot wrap or unwrap (missing, wrong, or its service refused):
    nothing sealed can be read or written until it is back. Never a reason to skip a record."""


class Kek(Protocol):
    """``wrap(data_key, user_id)`` returns ``(kek_id, blob)``: ``blob`` is opaque and only
    ``unwrap(blob, user_id, kek_id)`` by the key-encryption key ``kek_id`` names turns it back into
    ``data_key``; the user id is bound to the blob (authenticated), so one user's wrapped key
    cannot be passed off as another's. ``kek_id`` is the current key's name (what ``wrap`` uses);
    ``holds(kek_id)`` whether this process can unwrap what that key wrapped.

    Rotation: ``rotate()`` makes a new key current and returns the ids of the keys it replaces
    (they still unwrap until ``retire``); ``rewrap(blob, user_id, kek_id)`` is ``wrap`` of
    ``unwrap``, under the current key; ``retire(kek_ids)`` destroys those keys for good."""

    @property
    def kek_id(self) -> str: ...

    def holds(self, kek_id: str) -> bool: ...

    def wrap(self, data_key: bytes, user_id: str) -> tuple[str, bytes]: ...

    def unwrap(self, blob: bytes, user_id: str, kek_id: str) -> bytes: ...

    def rewrap(self, blob: bytes, user_id: str, kek_id: str) -> tuple[str, bytes]: ...

    def rotate(self) -> list[str]: ...

    def retire(self, kek_ids: list[str]) -> None: ...

    def refresh(self) -> None: ...


class KekRefused(KekUnavailable):
    """The key store refuses keys wrapped under this KEK: a rotation retired it. Wrap again once
    this process has the new one (``Kek.refresh``)."""


def _fingerprint(key: bytes) -> str:
    # Named by a fingerprint, not the file: a process with another key file is told so.
    return f"local:{hashlib.sha256(b'memstream-kek-id' + key).hexdigest()[:16]}"


class LocalKek:
    """256-bit keys in files (0600, under ``MEMSTREAM_HOME`` by default): ``path`` is version 1,
    ``path.<n>`` version ``n``; the highest version present is current. Made on first use. Every
    process of a deployment reads the same directory: a version added by a rotation is found
    when a process next wraps, or meets a blob it cannot name. Back the directory up apart from
    the key store: either alone reads nothing."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._seen: tuple[int, int] | None = None  # the directory's (mtime_ns, inode) when last read
        self._versions: dict[int, tuple[str, AESGCM]] = {}
        if not self._files():
            self._write(self.path)
        self._load()

    @staticmethod
    def exists(path: Path) -> bool:
        """Whether some version of the key at ``path`` is there."""
        return bool(LocalKek._versions_at(Path(path)))

    def _files(self) -> dict[int, Path]:
        return self._versions_at(self.path)

    @staticmethod
    def _versions_at(path: Path) -> dict[int, Path]:
        if not path.parent.is_dir():
            return {}
        name = re.escape(path.name)
        found = {}
        for p in path.parent.iterdir():
            if p.name == path.name:
                found[1] = p
            elif m := re.fullmatch(name + r"\.(\d+)", p.name):
                found[int(m[1])] = p
        return found

    def _write(self, path: Path) -> bool:
        """A new random key at ``path`` unless one is there; whether this call made it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written aside, then linked in: a process starting alongside never reads half a key.
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(AESGCM.generate_key(bit_length=256))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def _load(self) -> None:
        st = self.path.parent.stat()
        versions = {}
        for n, p in self._files().items():
            try:
                key = p.read_bytes()
            except FileNotFoundError:  # retired meanwhile
                continue
            if len(key) != 32:
                raise KekUnavailable(f"{p} is not a 256-bit key-encryption key ({len(key)} bytes)")
            versions[n] = (_fingerprint(key), AESGCM(key))
        if not versions:
            raise KekUnavailable(f"no key-encryption key at {self.path}")
        self._versions, self._seen = versions, (st.st_mtime_ns, st.st_ino)

    def _refresh(self) -> None:
        """Read the directory again if it changed (a stat: cheap enough for every wrap)."""
        st = self.path.parent.stat()
        if (st.st_mtime_ns, st.st_ino) != self._seen:
            self._load()

    @property
    def kek_id(self) -> str:
        return self._versions[max(self._versions)][0]

    def _by_id(self, kek_id: str) -> AESGCM | None:
        for kid, aead in self._versions.values():
            if kid == kek_id:
                return aead
        return None

    def holds(self, kek_id: str) -> bool:
        self._refresh()  # a version retired elsewhere is let go of here too
        if self._by_id(kek_id) is None:
            self._load()  # a network file system may report the directory unchanged for a while
        return self._by_id(kek_id) is not None

    def refresh(self) -> None:
        self._load()

    def wrap(self, data_key: bytes, user_id: str) -> tuple[str, bytes]:
        self._refresh()
        kek_id, aead = self._versions[max(self._versions)]
        nonce = os.urandom(12)
        return kek_id, nonce + aead.encrypt(nonce, data_key, user_id.encode())

    def unwrap(self, blob: bytes, user_id: str, kek_id: str) -> bytes:
        if not self.holds(kek_id):
            raise KekUnavailable(f"a data key of this user is wrapped by {kek_id}, which this process does not "
                                 f"have (held: {', '.join(k for k, _ in self._versions.values())}; retired by a "
                                 "rotation, or another deployment's)")
        try:
            return self._by_id(kek_id).decrypt(blob[:12], blob[12:], user_id.encode())
        except InvalidTag:
            raise KekUnavailable(f"a data key of this user does not open with {kek_id}") from None

    def rewrap(self, blob: bytes, user_id: str, kek_id: str) -> tuple[str, bytes]:
        return self.wrap(self.unwrap(blob, user_id, kek_id), user_id)

    def rotate(self) -> list[str]:
        self._refresh()
        while not self._write(self.path.with_name(f"{self.path.name}.{max(self._files()) + 1}")):
            pass  # another rotation took that version: take the next
        old = [kid for kid, _ in self._versions.values()]
        self._load()
        return [k for k in old if k != self.kek_id]

    def retire(self, kek_ids: list[str]) -> None:
        """Overwrite and unlink the files of ``kek_ids`` (never the current one). Overwriting is
        what a file system allows: a copy-on-write or journalled disk may keep old blocks, which is
        why a backup of this directory is kept apart and rotated out too."""
        self._refresh()
        for n, p in self._files().items():
            if n != max(self._versions) and self._versions.get(n, ("",))[0] in kek_ids:
                with open(p, "r+b") as f:
                    f.write(os.urandom(32))
                    f.flush()
                    os.fsync(f.fileno())
                p.unlink()
                log.info("key-encryption key %s retired (%s shredded)", self._versions[n][0], p.name)
        self._load()


class KmsKek:
    """An AWS KMS key (``key_id``: its id, ARN or alias) through boto3: ``Encrypt`` and ``Decrypt``
    with the user id as encryption context, so KMS itself refuses a blob under another user.
    Blobs are named by the key ARN KMS reports; rotation needs ``key_id`` to be an alias: it makes
    a new KMS key, points the alias at it and schedules the old one for deletion after
    ``pending_days`` (KMS' own floor is 7)."""

    ALIAS_SETTLES_S = 120.0  # how long a rotation waits for the alias to name the new key everywhere it asks

    def __init__(self, client, key_id: str, pending_days: int = 7):
        self._kms, self._key, self._pending = client, key_id, pending_days
        self._current: str | None = None  # the key's ARN, once a rotation made it

    @property
    def kek_id(self) -> str:
        """What blobs wrapped now are named by: the new key's ARN after a rotation here (KMS names
        every blob by the ARN it reports), else the configured id."""
        return f"kms:{self._current or self._key}"

    def refresh(self) -> None:
        pass  # KMS resolves the alias at every call

    def holds(self, kek_id: str) -> bool:
        return kek_id.startswith("kms:")  # KMS decides, by the key the blob names and its policy

    def _call(self, what: str, op, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return op(**kwargs)
        except (BotoCoreError, ClientError) as exc:
            code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else type(exc).__name__
            raise KekUnavailable(f"KMS could not {what}: {code}") from exc

    def wrap(self, data_key: bytes, user_id: str) -> tuple[str, bytes]:
        r = self._call(f"wrap a data key with {self._key}", self._kms.encrypt, KeyId=self._key, Plaintext=data_key,
                       EncryptionContext={"memstream_user": user_id})
        return f"kms:{r.get('KeyId') or self._key}", r["CiphertextBlob"]

    def unwrap(self, blob: bytes, user_id: str, kek_id: str) -> bytes:
        return self._call("unwrap a data key of this user", self._kms.decrypt, CiphertextBlob=blob,
                          EncryptionContext={"memstream_user": user_id}, **_source(kek_id))["Plaintext"]

    def rewrap(self, blob: bytes, user_id: str, kek_id: str) -> tuple[str, bytes]:
        # ReEncrypt: the data key is never in this process' memory.
        context = {"memstream_user": user_id}
        r = self._call("wrap a data key again", self._kms.re_encrypt, CiphertextBlob=blob,
                       SourceEncryptionContext=context, DestinationKeyId=self._current or self._key,
                       DestinationEncryptionContext=context,
                       **{f"Source{k}": v for k, v in _source(kek_id).items()})
        return f"kms:{r.get('KeyId') or self._key}", r["CiphertextBlob"]

    def rotate(self) -> list[str]:
        if not self._key.startswith("alias/"):
            raise KekUnavailable(f"rotating a KMS key-encryption key needs an alias (not {self._key}): every "
                                 "process wraps under what the alias names")
        old = self._call("describe the current key", self._kms.describe_key, KeyId=self._key)["KeyMetadata"]["Arn"]
        new = self._call("create a key", self._kms.create_key, Description="memstream key-encryption key",
                         KeyUsage="ENCRYPT_DECRYPT")["KeyMetadata"]["Arn"]
        self._call("point the alias at the new key", self._kms.update_alias, AliasName=self._key, TargetKeyId=new)
        self._current = new
        # An alias change reaches every KMS endpoint within seconds, not at once: until this
        # process wraps under the new key through it, others may still wrap under the old one.
        deadline = time.monotonic() + self.ALIAS_SETTLES_S
        while self._call("wrap through the alias", self._kms.encrypt, KeyId=self._key, Plaintext=b"probe",
                         EncryptionContext={"memstream_user": "probe"}).get("KeyId", new) != new:
            if time.monotonic() > deadline:
                raise KekUnavailable(f"{self._key} still names the old key {self.ALIAS_SETTLES_S:.0f} s after the "
                                     "rotation pointed it at the new one")
            time.sleep(1.0)
        return [f"kms:{old}", f"kms:{self._key}"]  # blobs of before are named by the ARN or, before it, the alias

    def retire(self, kek_ids: list[str]) -> None:
        for kek_id in kek_ids:
            key = kek_id.removeprefix("kms:")
            if key.startswith("alias/"):  # now names the new key
                continue
            try:
                self._call(f"schedule {key} for deletion", self._kms.schedule_key_deletion, KeyId=key,
                           PendingWindowInDays=self._pending)
            except KekUnavailable as exc:  # retired by an earlier rotation: pending deletion, or gone
                if not any(code in str(exc) for code in ("KMSInvalidStateException", "NotFoundException")):
                    raise
                continue
            log.info("key-encryption key %s scheduled for deletion in %d days", kek_id, self._pending)


def _source(kek_id: str) -> dict:
    """The KeyId to name when opening a blob of ``kek_id``: none for an alias (it may name
    another key since the blob was made; KMS reads the key from a symmetric blob itself)."""
    key = kek_id.removeprefix("kms:")
    return {} if key.startswith("alias/") else {"KeyId": key}
