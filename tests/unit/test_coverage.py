"""Read coverage (service_graph/coverage.py, contract/offset_log.py): which offsets a batch planned,
which it did not see, and which of those retention deleted."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from pyspark.sql import SparkSession

from hotswap.contract.offset_log import first_offsets, planned_at, planned_ends
from hotswap.service_graph.coverage import OffsetLog, PlannedRange, Seen, Unread, unread

ENTRY = (
    "v1\n"
    '{"batchWatermarkMs":0,"batchTimestampMs":1795784374551,"conf":{"spark.sql.shuffle.partitions":"2"}}\n'
    '{"ns.events":{"1":600,"0":600}}'
)


def test_the_end_offsets_are_read_from_sparks_offset_log_entry() -> None:
    assert planned_ends(ENTRY, "ns.events") == {0: 600, 1: 600}


def test_the_first_offsets_are_read_from_the_sources_entry() -> None:
    assert first_offsets('\x00v1\n{"ns.events":{"0":0,"1":7}}', "ns.events") == {0: 0, 1: 7}
    assert first_offsets('\x00v1\n{"ns.events":{"0":0,"1":7}}', "other") is None


def test_an_entry_that_does_not_name_the_topic_plans_nothing() -> None:
    assert planned_ends(ENTRY, "other.events") is None
    assert planned_ends("v1\n{}\n", "ns.events") is None
    assert planned_ends("v1\n{}\n{not json", "ns.events") is None
    assert planned_ends('v1\n{}\n{"ns.events":{"0":"x"}}', "ns.events") is None
    # The metadata line is never read as offsets, whatever the topic is called.
    assert planned_ends('v1\n{"conf":{"0":1}}\n{"conf":{"0":5}}', "conf") == {0: 5}


def test_a_batch_that_saw_its_whole_range_left_nothing_unread() -> None:
    assert unread({0: 600, 1: 600}, {0: 599, 1: 599}) == []
    # A replayed batch whose state is already recorded has seen past its own end.
    assert unread({0: 600}, {0: 800}) == []


def test_a_partition_the_batch_never_saw_is_unread_from_its_first_offset() -> None:
    assert unread({0: 600, 1: 600}, {0: 599}) == [Unread(1, 0, 600)]


def test_a_tail_the_batch_did_not_reach_is_unread() -> None:
    assert unread({0: 600, 1: 600}, {0: 599, 1: 420}) == [Unread(1, 421, 600)]
    assert str(Unread(1, 421, 600)) == "partition 1 [421, 600)"


def test_a_local_checkpoints_offset_log_is_read_as_files(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "sources" / "0").mkdir(parents=True)
    (tmp_path / "sources" / "0" / "0").write_text('\x00v1\n{"ns.events":{"0":0,"1":5}}', encoding="utf-8")
    (tmp_path / "offsets" / "0").write_text(ENTRY.replace("600", "300"), encoding="utf-8")
    (tmp_path / "offsets" / "1").write_text(ENTRY, encoding="utf-8")
    log = OffsetLog(cast(SparkSession, None), str(tmp_path), "ns.events")  # a local checkpoint needs no Spark
    # The first batch starts where the query's first offsets say; each later one where the one before ended.
    assert log.batch(0) == PlannedRange({0: 0, 1: 5}, {0: 300, 1: 300})
    assert log.batch(1) == PlannedRange({0: 300, 1: 300}, {0: 600, 1: 600})
    assert log.batch(2) is None
    assert OffsetLog(cast(SparkSession, None), str(tmp_path), "ns.events").batch(1) == log.batch(1)


def test_offsets_not_read_and_below_the_log_start_are_expired() -> None:
    planned = PlannedRange({0: 100, 1: 100, 2: 100}, {0: 200, 1: 200, 2: 200})
    # Partition 0 read all of its range; partition 1 from 150; partition 2 no row at all.
    seen = {0: Seen(100, 199, 100), 1: Seen(150, 199, 50)}
    assert not planned.fully_read(seen)
    # Retention deleted partition 1 up to 150 and all of partition 2's range.
    assert planned.expired(seen, {0: 0, 1: 150, 2: 250}) == 50 + 100
    # Above the log start an offset not read is a transaction marker or compaction, not retention.
    assert planned.expired(seen, {0: 0, 1: 0, 2: 0}) == 0


def test_a_segment_deleted_while_the_batch_read_it_leaves_a_hole_that_is_expired() -> None:
    # Rows 100-149 were fetched, then retention deleted up to 180 and the read went on from 180.
    planned = PlannedRange({0: 100}, {0: 200})
    seen = {0: Seen(100, 199, 70)}
    assert not planned.fully_read(seen)
    assert planned.expired(seen, {0: 180}) == 30
    # The same hole above the log start: transaction markers, not expired.
    assert planned.expired(seen, {0: 100}) == 0


def test_a_range_read_whole_needs_no_log_start() -> None:
    planned = PlannedRange({0: 100, 1: 100}, {0: 200, 1: 100})
    assert planned.fully_read({0: Seen(100, 199, 100)})
    # A partition added to the topic since (its start unknown) is never counted as expired.
    assert PlannedRange({0: 100}, {0: 200, 3: 50}).fully_read({0: Seen(100, 199, 100)})


def test_when_spark_planned_a_batch_and_how_much_comes_from_its_entry_without_a_read_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text(ENTRY.replace("600", "450"), encoding="utf-8")
    (tmp_path / "offsets" / "4").write_text(ENTRY, encoding="utf-8")
    log = OffsetLog(cast(SparkSession, None), str(tmp_path), "ns.events")
    assert log.last(4) is None, "batch 4's entry was not read yet"
    log.batch(4)
    last = log.last(4)
    assert last is not None
    assert last.planned_at_ms == 1795784374551  # the entry's metadata
    assert last.offsets == 300  # 150 in each partition
    assert log.last(5) is None
    assert planned_at("v1\nnot json\n{}") is None
    assert planned_at('v1\n{"batchTimestampMs":0}') is None
    assert planned_at("v1") is None
