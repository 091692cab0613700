"""A closing graph's own micro-batches: how far a batch reads under the row cap, what its offset log
says, and when a marker wakes it (execution_graph/closing_query.py); and the marker producer that
says a marker is written only once every partition took it (service_graph/kafka_io.py)."""

from __future__ import annotations

from hotswap.contract.settings import Settings
from hotswap.execution_graph.closing_query import BatchRange, capped_end, parse_offset_log
from hotswap.service_graph.kafka_io import MarkerWriter, _Awaited
from hotswap.service_graph.routing import Marker


def test_a_batch_under_the_cap_reads_everything_that_waits() -> None:
    assert capped_end({0: 10, 1: 5}, {0: 40, 1: 5, 2: 3}, cap=100) == {0: 40, 1: 5, 2: 3}


def test_the_cap_splits_over_partitions_by_their_rows_and_starves_none() -> None:
    # 2,400 rows skewed into partition 0, one marker alone in partition 3.
    end = capped_end({0: 0, 1: 0, 2: 0, 3: 0}, {0: 2_401, 1: 81, 2: 301, 3: 1}, cap=264)
    assert end[3] == 1, "a partition holding only a marker is read in the first batch"
    assert 0 < end[0] < 2_401
    assert sum(end.values()) <= 264 + 4


def test_offsets_never_move_back_when_kafka_reports_less() -> None:
    assert capped_end({0: 50}, {0: 40}, cap=None) == {0: 50}


def test_the_offset_log_keeps_both_ends_and_reads_as_sparks() -> None:
    text = BatchRange(7, {0: 3, 1: 0}, {0: 9, 1: 4}).log_text("t")
    assert text.splitlines()[0] == "v1"
    assert parse_offset_log(text) == ({0: 3, 1: 0}, {0: 9, 1: 4})
    spark_written = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"t":{"0":12,"1":5}}'
    assert parse_offset_log(spark_written) == (None, {0: 12, 1: 5})


def test_a_batch_counts_only_the_rows_it_reads() -> None:
    assert BatchRange(0, {0: 5, 1: 2}, {0: 9, 1: 2, 2: 3}).rows == 4 + 0 + 0


def test_a_marker_is_written_once_every_partition_took_it() -> None:
    taken: list[tuple[str, int]] = []
    writer = MarkerWriter(Settings(namespace="unit").kafka, lambda topic, watermark: taken.append((topic, watermark)))
    marker = Marker("q", "t", 20_000)
    awaited = _Awaited(3)
    writer._taken(marker, awaited, None)
    writer._taken(marker, awaited, None)
    assert taken == [], "two of three partitions are not the marker"
    writer._taken(marker, awaited, None)
    assert taken == [("t", 20_000)]
