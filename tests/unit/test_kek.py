"""Key-encryption keys: a local file and AWS KMS (botocore's Stubber)."""
import os
import stat

import boto3
import pytest
from botocore.stub import Stubber

from memstream.keys.kek import KekUnavailable, KmsKek, LocalKek


def test_a_local_kek_is_made_once_readable_by_its_owner_only_and_binds_the_user(tmp_path):
    kek = LocalKek(tmp_path / "keys" / "kek")
    assert stat.S_IMODE(os.stat(kek.path).st_mode) == 0o600
    kek_id, blob = kek.wrap(b"k" * 32, "ana")
    assert kek_id == kek.kek_id
    assert LocalKek(kek.path).unwrap(blob, "ana", kek_id) == b"k" * 32  # the same file, another process
    with pytest.raises(KekUnavailable, match="does not open"):
        kek.unwrap(blob, "bo", kek_id)
    with pytest.raises(KekUnavailable, match="does not have"):
        LocalKek(tmp_path / "another").unwrap(blob, "ana", kek_id)
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
                          {"CiphertextBlob": b"wrapped", "KeyId": "k",
                           "EncryptionContext": {"memstream_user": "ana"}})
        stub.add_client_error("decrypt", service_error_code="InvalidCiphertextException", http_status_code=400)
        stub.add_response("decrypt", {"Plaintext": b"k" * 32, "KeyId": "k"},  # an alias may name another key now
                          {"CiphertextBlob": b"old", "EncryptionContext": {"memstream_user": "ana"}})
        assert kek.wrap(b"k" * 32, "ana") == ("kms:k", b"wrapped")
        assert kek.unwrap(b"wrapped", "ana", "kms:k") == b"k" * 32
        with pytest.raises(KekUnavailable, match="could not unwrap"):
            kek.unwrap(b"wrapped", "bo", "kms:k")
        assert kek.unwrap(b"old", "ana", "kms:alias/memstream") == b"k" * 32
        stub.assert_no_pending_responses()
    assert kek.kek_id == "kms:alias/memstream"


def test_a_local_rotation_makes_a_new_current_key_and_retiring_the_old_one_shreds_its_file(tmp_path):
    kek = LocalKek(tmp_path / "keys" / "kek")
    first, blob = kek.wrap(b"k" * 32, "ana")
    other = LocalKek(kek.path)  # another process of the deployment
    assert kek.rotate() == [first]
    second = kek.kek_id
    assert second != first and other.wrap(b"k" * 32, "ana")[0] == second  # it finds the new version
    again = kek.rewrap(blob, "ana", first)
    assert again[0] == second and kek.unwrap(again[1], "ana", second) == b"k" * 32
    kek.retire([first])
    assert sorted(p.name for p in kek.path.parent.iterdir()) == ["kek.2"]
    assert stat.S_IMODE(os.stat(kek.path.with_name("kek.2")).st_mode) == 0o600
    for process in (kek, other, LocalKek(kek.path)):
        assert not process.holds(first)
        with pytest.raises(KekUnavailable, match="does not have"):
            process.unwrap(blob, "ana", first)
        assert process.unwrap(again[1], "ana", second) == b"k" * 32


def test_a_kms_rotation_points_the_alias_at_a_new_key_rewraps_in_kms_and_schedules_the_old_for_deletion():
    client = boto3.client("kms", region_name="eu-west-1", aws_access_key_id="x", aws_secret_access_key="x")
    kek = KmsKek(client, "alias/memstream", pending_days=7)
    old, new = "arn:aws:kms:eu-west-1:1:key/old", "arn:aws:kms:eu-west-1:1:key/new"
    ctx = {"memstream_user": "ana"}
    with Stubber(client) as stub:
        stub.add_response("describe_key", {"KeyMetadata": {"KeyId": "old", "Arn": old}}, {"KeyId": "alias/memstream"})
        stub.add_response("create_key", {"KeyMetadata": {"KeyId": "new", "Arn": new}},
                          {"Description": "memstream key-encryption key", "KeyUsage": "ENCRYPT_DECRYPT"})
        stub.add_response("update_alias", {}, {"AliasName": "alias/memstream", "TargetKeyId": new})
        stub.add_response("encrypt", {"CiphertextBlob": b"p", "KeyId": old}, None)  # the alias not settled yet
        stub.add_response("encrypt", {"CiphertextBlob": b"p", "KeyId": new}, None)
        stub.add_response("re_encrypt", {"CiphertextBlob": b"again", "KeyId": new},
                          {"CiphertextBlob": b"wrapped", "SourceKeyId": old, "SourceEncryptionContext": ctx,
                           "DestinationKeyId": new, "DestinationEncryptionContext": ctx})
        stub.add_response("schedule_key_deletion", {"KeyId": old, "PendingWindowInDays": 7},
                          {"KeyId": old, "PendingWindowInDays": 7})
        stub.add_client_error("schedule_key_deletion", service_error_code="KMSInvalidStateException",
                              http_status_code=400)  # retired by an earlier rotation: passed over
        assert kek.rotate() == [f"kms:{old}", "kms:alias/memstream"]
        assert kek.kek_id == f"kms:{new}"
        assert kek.rewrap(b"wrapped", "ana", f"kms:{old}") == (f"kms:{new}", b"again")
        kek.retire([f"kms:{old}", "kms:alias/memstream", "kms:arn:aws:kms:eu-west-1:1:key/older"])
        stub.assert_no_pending_responses()
    with pytest.raises(KekUnavailable, match="needs an alias"):
        KmsKek(client, "key/123").rotate()


async def test_a_kms_rotation_of_a_store_wraps_each_key_once_and_ends():
    """KMS names every blob by the key's ARN: a rotation must know the new one's, or every key
    looks stale for ever."""
    from memstream.keys.data_keys import DataKeys
    from memstream.keys.wrapped import MemoryWrappedKeys
    from memstream.keys.rotation import rotate

    client = boto3.client("kms", region_name="eu-west-1", aws_access_key_id="x", aws_secret_access_key="x")
    kek = KmsKek(client, "alias/memstream")
    old, new = "arn:aws:kms:eu-west-1:1:key/old", "arn:aws:kms:eu-west-1:1:key/new"
    store = MemoryWrappedKeys()
    with Stubber(client) as stub:
        stub.add_response("encrypt", {"CiphertextBlob": b"w-old", "KeyId": old}, None)  # the digest secret
        stub.add_response("decrypt", {"Plaintext": b"s" * 32, "KeyId": old}, None)  # read back by ready
        stub.add_response("encrypt", {"CiphertextBlob": b"w-old", "KeyId": old}, None)  # ana's data key
        keys = await DataKeys(kek, store).ready()
        stub.add_response("describe_key", {"KeyMetadata": {"KeyId": "old", "Arn": old}}, None)
        stub.add_response("create_key", {"KeyMetadata": {"KeyId": "new", "Arn": new}}, None)
        stub.add_response("update_alias", {}, None)
        stub.add_response("encrypt", {"CiphertextBlob": b"p", "KeyId": new}, None)
        for _ in range(2):  # the secret and ana's key, once each
            stub.add_response("re_encrypt", {"CiphertextBlob": b"w-new", "KeyId": new}, None)
        stub.add_response("schedule_key_deletion", {"KeyId": old, "PendingWindowInDays": 7}, None)
        kek_id, wrapped = kek.wrap(b"k" * 32, "x")  # stands in for ana's key made through the alias
        await store.create(b"ana", kek_id, wrapped)
        rotation = await rotate(keys)
        stub.assert_no_pending_responses()
    assert (rotation.rewrapped, rotation.left, rotation.retired) == (1, 0, ["kms:alias/memstream", f"kms:{old}"])
    assert await store.stale(f"kms:{new}", 10) == [] and (await store.secret())[0] == f"kms:{new}"
