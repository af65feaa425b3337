"""Formation's parts (``formation.parts.pieces``): a partition's records cut after each run of
imported events, so no user's chain runs across one (the turns after it wait for what the import appended)."""
from memstream.streams.log.records import Record
from memstream.streams.log.screening import IMPORTED
from memstream.streams.worker.formation.parts import pieces


def record(offset: int, imported: bool = False) -> Record:
    return Record("events", 0, offset, b"u", b"{}", ((IMPORTED, b"1"),) if imported else (), 0)


def test_a_partitions_records_are_cut_after_each_run_of_imported_events_and_never_left_empty():
    said = [record(0), record(1, True), record(2, True), record(3), record(4, True), record(5)]
    assert [[r.offset for r in p] for p in pieces(said)] == [[0, 1, 2], [3, 4], [5]]
    assert [[r.offset for r in p] for p in pieces([record(0), record(1)])] == [[0, 1]]
    assert pieces([record(0, True)]) == [[record(0, True)]] and pieces([]) == []
