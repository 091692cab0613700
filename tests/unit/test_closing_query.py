"""A closing graph's own micro-batches: how far a batch reads under the row cap, what its offset log
says, and when a marker wakes it (execution_graph/closing_query.py); and the marker producer that
says a marker is written only once every partition took it (service_graph/kafka_io.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from hotswap.contract.settings import Settings
from hotswap.execution_graph import closing_query
from hotswap.execution_graph.closing import ClosingState
from hotswap.execution_graph.closing_query import (
    HEADERS_DUE_S,
    BatchRange,
    ClosingQuery,
    PlannedBatch,
    capped_end,
    parse_offset_log,
)
from hotswap.service_graph.kafka_io import MarkerWriter, _Awaited
from hotswap.service_graph.routing import Marker


@dataclass(frozen=True)
class Placed:
    partition: int
    offset: int


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


def test_the_offset_log_keeps_both_ends_and_what_closes_and_reads_as_sparks() -> None:
    batch = BatchRange(7, {0: 3, 1: 0}, {0: 9, 1: 4}, through=30_000)
    text = batch.log_text("t")
    assert text.splitlines()[0] == "v1"
    assert parse_offset_log(7, text) == PlannedBatch(batch, start_recorded=True, through_recorded=True)
    nothing = BatchRange(8, {0: 9}, {0: 9})
    assert parse_offset_log(8, nothing.log_text("t")) == PlannedBatch(nothing, True, True)
    spark_written = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"t":{"0":12,"1":5}}'
    assert parse_offset_log(3, spark_written) == PlannedBatch(BatchRange(3, {}, {0: 12, 1: 5}), False, False)
    earlier_loop = 'v1\n{"batchWatermarkMs":0,"start":{"t":{"0":3}}}\n{"t":{"0":9}}'
    assert parse_offset_log(4, earlier_loop) == PlannedBatch(BatchRange(4, {0: 3}, {0: 9}), True, False)


def test_a_batch_counts_only_the_rows_it_reads() -> None:
    assert BatchRange(0, {0: 5, 1: 2}, {0: 9, 1: 2, 2: 3}).rows == 4 + 0 + 0


def test_a_marker_is_written_once_every_partition_took_it() -> None:
    taken: list[tuple[str, int, dict[int, int]]] = []
    writer = MarkerWriter(
        Settings(namespace="unit").kafka, lambda topic, watermark, at: taken.append((topic, watermark, dict(at)))
    )
    marker = Marker("q", "t", 20_000)
    awaited = _Awaited(3)
    writer._taken(marker, awaited, Placed(0, 41))
    writer._taken(marker, awaited, Placed(2, 7))
    assert taken == [], "two of three partitions are not the marker"
    writer._taken(marker, awaited, Placed(1, 12))
    assert taken == [("t", 20_000, {0: 41, 1: 12, 2: 7})]


class _Files:
    """A checkpoint directory in a dict: name -> text."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def read_text(self, name: str) -> str | None:
        return self.files.get(name)

    def batch_ids(self, name: str) -> set[int]:
        return {int(n.rsplit("/", 1)[1]) for n in self.files if n.startswith(f"{name}/")}

    def write_once(self, name: str, text: str) -> bool:
        return self.files.setdefault(name, text) == text

    def delete(self, name: str) -> None:
        self.files.pop(name, None)


def _loop(files: dict[str, str] | None = None, on_commit: Callable[[], None] | None = None) -> ClosingQuery:
    """A closing graph's loop that is never started: no Spark, no Kafka, its checkpoint in `files`."""
    unused: Any = None
    fake: Any = _Files({} if files is None else files)
    return ClosingQuery(
        unused,
        name="g",
        query_id="6f1c2a3e-0000-4000-8000-000000000001",  # a Spark query id is a UUID
        topic="t",
        closer=unused,
        files=fake,
        ends=unused,
        cap=None,
        slide_ms=10_000,
        retry_deadline_s=1.0,
        on_commit=on_commit,
    )


def test_a_batch_counts_a_marker_the_producer_saw_only_if_it_reads_past_it() -> None:
    query = _loop()
    query.notify(20_000, {0: 5, 1: 3})
    query.notify(30_000, {0: 9, 1: 8})
    assert query._known({0: 10, 1: 8}) == {0: 30_000, 1: 20_000}, "partition 1 ends at the 30 s marker's offset"
    assert query._known({0: 5, 1: 9}) == {1: 30_000}


def _replayed(files: dict[str, str]) -> BatchRange:
    query = _loop(files)
    runs: list[BatchRange] = []
    query._run = runs.append  # type: ignore[method-assign,assignment]
    assert query._resume() == (5, {0: 9})
    (batch,) = runs
    return batch


def test_a_batch_an_earlier_version_planned_is_replayed_as_far_as_its_state_file_closed() -> None:
    log = 'v1\n{"batchWatermarkMs":0,"start":{"t":{"0":3}}}\n{"t":{"0":9}}'
    state = ClosingState(batch_id=4, closed_through=30_000, markers={0: 30_000})
    # It wrote its state (closed through 30 s) before its results, then stopped: results may be out.
    assert _replayed({"offsets/4": log, "closing/4": state.to_json()}) == BatchRange(4, {0: 3}, {0: 9}, 30_000)
    # It stopped before its state: nothing of it is out, and the next batch closes what it read.
    assert _replayed({"offsets/4": log}) == BatchRange(4, {0: 3}, {0: 9}, None)


def test_rows_that_close_nothing_wait_for_the_batch_that_closes_their_window() -> None:
    query = _loop()
    # No batch yet (a start or a restart): the headers are due at once, markers may wait in them.
    assert query._headers_due({0: 9}, {0: 9})
    query._last_batch = time.monotonic()
    assert not query._headers_due({0: 9}, {0: 9}), "a batch just ran: the rows wait"
    assert query._headers_due({0: 9}, {0: 20}), "the row cap left rows behind: the markers may lie there"
    query._last_batch = time.monotonic() - HEADERS_DUE_S
    assert query._headers_due({0: 9}, {0: 9}), "no batch for a while: a notice may have been lost"


def test_a_graph_whose_topic_was_empty_at_its_first_look_reads_no_headers_until_they_are_due() -> None:
    # A graph a swap just deployed: nothing routed to it yet. Its first rows come with markers whose
    # notices it hears, so it runs no headers pass of its own during the old graph's drain.
    query = _loop()
    assert query._waits(BatchRange(0, {0: 0}, {0: 0}), False, {0: 0})
    assert query._waits(BatchRange(0, {0: 0}, {0: 40}), False, {0: 40}), "rows after the first look wait"
    assert not query._waits(BatchRange(0, {0: 0}, {0: 40}, 20_000), False, {0: 40}), "a window closes"
    query._last_batch = time.monotonic() - HEADERS_DUE_S
    assert not query._waits(BatchRange(0, {0: 0}, {0: 40}), False, {0: 40}), "no batch for a while"


def test_a_graph_that_finds_rows_at_its_first_look_reads_their_headers_at_once() -> None:
    # A restart: markers may wait in the rows, and their notices went with the old process.
    query = _loop()
    assert not query._waits(BatchRange(3, {0: 10}, {0: 40}), False, {0: 40})
    assert not query._waits(BatchRange(3, {0: 40}, {0: 40}), True, {0: 40}), "a range left unread waits"


class _Closer:
    """A WindowCloser that closes nothing: only the loop's own bookkeeping runs."""

    def run(self, spark: object, batch_id: int, start: object, end: object, through: int | None) -> ClosingState:
        return ClosingState(batch_id=batch_id)

    def tidy(self, batch_id: int) -> None:
        pass


def test_a_committed_batch_tells_its_listener_once_its_progress_says_so() -> None:
    """A swap's drain waits for the old graph's progress: the executor is woken by the commit, and
    what it then reads must already hold the batch."""
    files: dict[str, str] = {}
    seen: list[int | None] = []

    def told() -> None:
        assert "commits/0" in files, "told only once the batch is committed"
        progress = query.lastProgress
        seen.append(None if progress is None else progress.batchId)

    query = _loop(files, on_commit=told)
    query._closer = _Closer()  # type: ignore[assignment]
    query._run(BatchRange(0, {0: 0}, {0: 4}, 20_000))
    assert "commits/0" in files
    assert seen == [0], "told once, after the batch's progress was reported"


def test_rows_deferred_to_the_next_close_job_wait_only_while_notices_say_their_markers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows a batch left unread because it closed only windows another version owns wait for the
    graph's next close job of its own windows; a loop that has heard no marker's notice yet (after a
    restart) reads them at once, and none waits longer than HEADERS_DUE_S."""
    deferred = ClosingState(batch_id=4, closed_through=20_000, unread={0: (0, 60)}, deferred=True)
    query = _loop()
    assert not query._defers(deferred), "no notice yet: the markers are in the rows"
    query.notify(30_000, {0: 61})
    assert query._defers(deferred)
    assert not query._defers(ClosingState(batch_id=4, unread={0: (0, 60)})), "left for the next batch's pass"
    now = time.monotonic()
    assert query._defers(deferred)
    monkeypatch.setattr(time, "monotonic", lambda: now + closing_query.HEADERS_DUE_S + 1)
    assert not query._defers(deferred), "waited long enough"
