"""Key-encryption keys: a local file and AWS KMS (botocore's Stubber)."""
import os
import stat

import boto3
import pytest
from botocore.stub import Stubber

from memstream.sealing.kek import KekUnavailable, KmsKek, LocalKek


def test_a_local_kek_is_made_once_readable_by_its_owner_only_and_binds_the_user(tmp_path):
    kek = LocalKek(tmp_path / "keys" / "kek")
    assert stat.S_IMODE(os.stat(kek.path).st_mode) == 0o600
    blob = kek.wrap(b"k" * 32, "ana")
    assert LocalKek(kek.path).unwrap(blob, "ana") == b"k" * 32  # the same file, another process
    with pytest.raises(KekUnavailable, match="does not open"):
        kek.unwrap(blob, "bo")
    with pytest.raises(KekUnavailable, match="does not open"):
        LocalKek(tmp_path / "another").unwrap(blob, "ana")
    (tmp_path / "short").write_bytes(b"abc")
    with pytest.raises(KekUnavailable, match="not a 256-bit"):
        LocalKek(tmp_path / "short")


def test_a_kms_kek_wraps_with_the_user_as_encryption_context():
    client = boto3.client("kms", region_name="eu-west-1", aws_access_key_id="x", aws_secret_access_key="x")
    kek = KmsKek(client, "alias/memstream")
    with Stubber(client) as stub:
        stub.add_response("encrypt", {"CiphertextBlob": b"wrapped", "KeyId": "k"},
                          {"KeyId": "alias/memstream", "Plaintext": b"k" * 32,
                           "EncryptionContext": {"memstream_user": "ana"}})
        stub.add_response("decrypt", {"Plaintext": b"k" * 32, "KeyId": "k"},
                          {"CiphertextBlob": b"wrapped", "KeyId": "alias/memstream",
                           "EncryptionContext": {"memstream_user": "ana"}})
        stub.add_client_error("decrypt", service_error_code="InvalidCiphertextException", http_status_code=400)
        assert kek.wrap(b"k" * 32, "ana") == b"wrapped"
        assert kek.unwrap(b"wrapped", "ana") == b"k" * 32
        with pytest.raises(KekUnavailable, match="could not unwrap"):
            kek.unwrap(b"wrapped", "bo")
        stub.assert_no_pending_responses()
    assert kek.kek_id == "kms:alias/memstream"
