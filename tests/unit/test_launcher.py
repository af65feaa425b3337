import uuid

from memstream.stack import launcher


def test_a_kafka_cluster_id_never_starts_with_a_dash(monkeypatch):
    # 0xF8 encodes as '-' first in base64url: the storage tool would take the id for an option.
    ids = iter([uuid.UUID(bytes=b"\xf8" + b"\x01" * 15), uuid.UUID(bytes=b"\x10" * 16)])
    monkeypatch.setattr(launcher.uuid, "uuid4", lambda: next(ids))
    cid = launcher._cluster_id()
    assert cid == "EBAQEBAQEBAQEBAQEBAQEA" and len(cid) == 22
