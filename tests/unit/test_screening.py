"""Which events-topic records formation and the commands projection apply, and the marker
formation writes when a partition's batch ends on records it decided nothing for."""
import uuid
import zlib
from datetime import datetime, timezone

from memstream.schemas import EpisodeRecorded, LogPosition, NothingDecided, ReminderScheduled, TurnRecorded, encode
from memstream.streams.log.screening import screen, expected_partition
from memstream.streams.worker.formation.recording import nothing_decided
from memstream.streams.log.records import Record


def record(value: bytes, key: bytes | None, partition: int, offset: int) -> Record:
    return Record("ev", partition, offset, key, value, (), 1_764_000_000_000)


def turn(user: str) -> TurnRecorded:
    return TurnRecorded.new(user_id=user, conversation_id="c", user_message="hi", assistant_message="")


def test_the_partition_is_murmur2_as_javas_and_not_crc32_as_librdkafkas_default():
    # The newcomer's kcat turn: CRC32 put it on partition 3, TurnLog's murmur2 on 1.
    key = b"kcat-porto-a61cd7"
    assert expected_partition(key, 4) == 1 and zlib.crc32(key) % 4 == 3


def test_a_record_on_another_partition_than_its_users_is_refused_with_the_kcat_flag():
    t = turn("kcat-porto-a61cd7")
    ok, letters = screen([record(encode(t), t.user_id.encode(), 1, 0), record(encode(t), t.user_id.encode(), 3, 0)],
                        "formation", 4)
    assert [r.partition for r, _ in ok] == [1]
    [(r, stage, reason)] = letters
    assert r.partition == 3 and stage == "formation"
    assert "partition 1 of 4" in reason and "-X partitioner=murmur2_random" in reason
    assert t.user_id not in reason  # it is logged, and a user id is often an e-mail address


def test_without_a_partition_count_only_the_key_is_checked():
    t = turn("u")
    ok, letters = screen([record(encode(t), b"u", 3, 0), record(encode(t), b"other", 3, 1), record(b"{", b"u", 3, 2)],
                        "formation", None)
    assert len(ok) == 1 and [why.split(":")[0] for _, _, why in letters] == ["record key does not match user_id",
                                                                            "undecodable event"]


def test_a_partition_whose_batch_ends_on_records_nothing_was_decided_for_gets_a_marker_after_them():
    formed_turn, command = turn("a"), ReminderScheduled.new(user_id="b", text="x", due_at=datetime.now(timezone.utc))
    records = [record(encode(formed_turn), b"a", 0, 5),             # partition 0 ends on a formed turn
               record(encode(turn("b")), b"b", 1, 7), record(encode(command), b"b", 1, 8),  # 1 on a command
               record(b"not json", b"c", 2, 9)]                      # 2 on a dead letter
    episode = EpisodeRecorded(decision_id=uuid.uuid4(), source_event_id=formed_turn.event_id,
                              source=LogPosition("ev", 0, 5), recorded_at=datetime.now(timezone.utc), user_id="a",
                              conversation_id="c", occurred_at=formed_turn.occurred_at, user_message="hi",
                              assistant_message="", embedding=b"", embedding_model="m")
    markers = nothing_decided(records, [(records[0], episode)])
    assert [(r.partition, d.source.offset) for r, d in markers] == [(1, 8), (2, 9)]
    assert all(isinstance(d, NothingDecided) for _, d in markers)
    assert markers[0][1].user_id == "b" and markers[0][1].source_event_id == command.event_id
    assert markers[1][1].user_id == "__memstream__"
    assert markers == nothing_decided(records, [(records[0], episode)])  # ids derive from the records
