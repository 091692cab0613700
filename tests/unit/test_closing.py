"""The closing engine's state: when a window closes, and where its rows are (execution_graph.closing)."""

from __future__ import annotations

from typing import Any

from py4j.protocol import Py4JError

from hotswap.contract.windows import Windowing
from hotswap.execution_graph.closing import (
    ClosingState,
    HeaderWatch,
    PartitionRead,
    _observed,
    advance,
    closable,
    closing_for,
)

TUMBLING = Windowing(10_000, 10_000)
SLIDING = Windowing(30_000, 10_000)


def test_a_window_closes_only_once_every_partition_has_read_a_marker_past_it() -> None:
    state = advance(
        ClosingState(),
        0,
        [
            PartitionRead(0, marker=20_000, first_offsets={10_000: 0}),
            PartitionRead(1, first_offsets={10_000: 1}),  # rows, but no marker yet (row cap)
        ],
        None,
        TUMBLING,
    )
    assert closable(state, partitions=2, windowing=TUMBLING) is None
    state = advance(state, 1, [PartitionRead(1, marker=20_000)], None, TUMBLING)
    through = closable(state, partitions=2, windowing=TUMBLING)
    assert through == 20_000
    closing = closing_for(state, through, start={0: 5, 1: 9}, end={0: 5, 1: 9}, windowing=TUMBLING)
    assert (closing.after, closing.through) == (None, 20_000)
    assert closing.offsets == {0: (0, 5), 1: (1, 9)}


def test_the_graph_closes_through_the_minimum_marker_not_the_maximum() -> None:
    reads = [
        PartitionRead(0, marker=60_000, first_offsets={40_000: 2}),
        PartitionRead(1, marker=30_000, first_offsets={20_000: 1}),
        PartitionRead(2, marker=40_000),  # an empty partition: markers only
        PartitionRead(3, marker=50_000),
    ]
    state = advance(ClosingState(), 0, reads, None, TUMBLING)
    assert closable(state, partitions=4, windowing=TUMBLING) == 30_000


def test_a_partition_never_read_holds_every_window_open() -> None:
    state = advance(ClosingState(), 0, [PartitionRead(0, marker=100_000)], None, TUMBLING)
    assert closable(state, partitions=2, windowing=TUMBLING) is None


def test_a_marker_the_producer_saw_taken_closes_before_it_is_read() -> None:
    state = advance(ClosingState(), 0, [PartitionRead(0, first_offsets={10_000: 0})], None, TUMBLING)
    assert closable(state, partitions=2, windowing=TUMBLING) is None
    assert closable(state, partitions=2, windowing=TUMBLING, known={0: 20_000}) is None, "partition 1: no marker"
    assert closable(state, partitions=2, windowing=TUMBLING, known={0: 20_000, 1: 30_000}) == 20_000
    # A marker inside a window closes only the windows that end before it.
    assert closable(state, partitions=2, windowing=TUMBLING, known={0: 27_500, 1: 30_000}) == 20_000
    # Rows no batch has read yet are read from where the batch starts.
    closing = closing_for(state, 20_000, start={0: 4, 1: 0}, end={0: 9, 1: 6}, windowing=TUMBLING)
    assert closing.offsets == {0: (0, 9), 1: (0, 6)}


def test_closing_never_moves_back_and_closes_each_window_once() -> None:
    read = PartitionRead(0, marker=20_000, first_offsets={10_000: 0, 20_000: 2})
    state = advance(ClosingState(), 0, [read], None, TUMBLING)
    assert closable(state, partitions=1, windowing=TUMBLING) == 20_000
    state = advance(state, 1, [], 20_000, TUMBLING)
    assert state.closed_through == 20_000
    # An older marker read again (a marker sent twice): nothing closes.
    state = advance(state, 2, [PartitionRead(0, marker=10_000)], None, TUMBLING)
    assert closable(state, partitions=1, windowing=TUMBLING) is None
    assert closable(state, partitions=1, windowing=TUMBLING, known={0: 15_000}) is None
    assert state.closed_through == 20_000
    state = advance(state, 3, [PartitionRead(0, marker=30_000)], None, TUMBLING)
    through = closable(state, partitions=1, windowing=TUMBLING)
    assert through == 30_000
    second = closing_for(state, through, start={0: 7}, end={0: 7}, windowing=TUMBLING)
    assert (second.after, second.through) == (20_000, 30_000)
    # Only the rows from the bucket of the window that closes: [20 s, 30 s) starts at offset 2.
    assert second.offsets == {0: (2, 7)}
    assert second.rows_since == 20_000 - 10_000 + 1


def test_a_batch_closes_only_what_its_plan_said_and_the_rest_waits() -> None:
    state = advance(ClosingState(), 0, [PartitionRead(0, marker=20_000)], None, TUMBLING)
    # The batch planned to close through 20 s; its headers read a marker at 40 s on the way.
    state = advance(state, 1, [PartitionRead(0, marker=40_000, first_offsets={30_000: 5})], 20_000, TUMBLING)
    assert state.closed_through == 20_000
    assert closable(state, partitions=1, windowing=TUMBLING) == 40_000, "the next batch closes the rest"
    assert set(state.first_offsets) == {30_000}


def test_a_closed_bucket_is_forgotten_and_its_late_duplicates_too() -> None:
    read = PartitionRead(0, marker=20_000, first_offsets={10_000: 0, 20_000: 3})
    state = advance(ClosingState(), 0, [read], 20_000, TUMBLING)
    assert set(state.first_offsets) == {20_000}
    # A replayed service batch writes rows of a closed window again, after the marker.
    state = advance(state, 1, [PartitionRead(0, first_offsets={10_000: 4})], None, TUMBLING)
    assert closable(state, partitions=1, windowing=TUMBLING) is None
    assert set(state.first_offsets) == {20_000}


def test_a_sliding_window_reads_every_bucket_it_spans() -> None:
    # 30 s windows sliding by 10 s: the window ending at 40 s holds [10 s, 40 s).
    read = PartitionRead(0, marker=30_000, first_offsets={10_000: 1, 20_000: 4, 30_000: 7})
    state = advance(ClosingState(), 0, [read], 30_000, SLIDING)
    assert set(state.first_offsets) == {10_000, 20_000, 30_000}  # each one is in the window ending at 40 s
    state = advance(state, 1, [PartitionRead(0, marker=40_000)], None, SLIDING)
    through = closable(state, partitions=1, windowing=SLIDING)
    assert through == 40_000
    closing = closing_for(state, through, start={0: 12}, end={0: 12}, windowing=SLIDING)
    assert closing.offsets == {0: (1, 12)}
    assert set(advance(state, 2, [], through, SLIDING).first_offsets) == {20_000, 30_000}


def test_the_state_survives_its_file() -> None:
    state = advance(
        ClosingState(),
        3,
        [PartitionRead(1, marker=20_000, first_offsets={20_000: 5}), PartitionRead(0, marker=30_000)],
        None,
        TUMBLING,
    )
    assert ClosingState.from_json(state.to_json()) == state


def test_rows_a_closing_batch_left_unread_are_read_by_the_next_close_and_headers() -> None:
    read = PartitionRead(0, marker=10_000, first_offsets={10_000: 3})
    state = advance(ClosingState(), 0, [read], 10_000, TUMBLING)
    # Batch 1 closes through 20 s and leaves its headers, [4, 9), for the next batch.
    state = advance(state, 1, [], 20_000, TUMBLING, unread={0: (4, 9)})
    assert state.unread == {0: (4, 9)}
    assert ClosingState.from_json(state.to_json()) == state
    # Rows of the window ending at 30 s may lie in the unread range: the next close reads it.
    closing = closing_for(state, 30_000, start={0: 9}, end={0: 12}, windowing=TUMBLING)
    assert closing.offsets == {0: (4, 12)}
    # A batch that reads the headers (of the unread range and its own) forgets the range.
    state = advance(state, 2, [PartitionRead(0, marker=30_000, first_offsets={20_000: 5})], None, TUMBLING)
    assert state.unread == {}
    assert closable(state, partitions=1, windowing=TUMBLING) == 30_000


# -- what a closing job learns of the headers it reads (HeaderWatch) ---------------------------------
def _metrics(watch: HeaderWatch, **given: int | None) -> dict[str, int | None]:
    """Metrics as Spark returns them: every aggregate named, those not given as an empty read has them."""
    names = [e.rsplit(" AS ", 1)[1] for e in watch.aggregates()]
    empty = {n: (0 if n.startswith(("rows_", "ahead_")) else None) for n in names}
    return {**empty, **given}


def test_a_closing_job_watches_the_buckets_still_open_after_it() -> None:
    closing = closing_for(ClosingState(), 20_000, start={0: 0}, end={0: 9}, windowing=TUMBLING)
    watch = HeaderWatch.for_closing(closing, TUMBLING)
    assert watch is not None
    assert watch.buckets == (20_000, 30_000)  # the next window's, and the one after
    sliding = HeaderWatch.for_closing(closing_for(ClosingState(), 40_000, {0: 0}, {0: 9}, SLIDING), SLIDING)
    assert sliding is not None
    # Windows ending after 40 s read from 20 s on (30 s windows every 10 s); two windows ahead.
    assert sliding.buckets == (20_000, 30_000, 40_000, 50_000, 60_000, 70_000, 80_000, 90_000)
    short_slide = Windowing(3_600_000, 60_000)
    assert HeaderWatch.for_closing(closing_for(ClosingState(), 0, {0: 0}, {0: 9}, short_slide), short_slide) is None


def test_what_a_closing_job_read_stands_for_a_headers_pass_of_its_rows() -> None:
    watch = HeaderWatch({0: (3, 10), 1: (0, 4)}, (20_000, 30_000))
    metrics = _metrics(watch, rows_0=7, rows_1=4, marker_0=25_000, first_0_0=5, first_1_1=2)
    reads = watch.reads(metrics, needed={0: (6, 10), 1: (0, 4)})
    assert reads == [
        PartitionRead(0, marker=25_000, first_offsets={20_000: 5}),
        PartitionRead(1, marker=None, first_offsets={30_000: 2}),
    ]
    state = advance(ClosingState(closed_through=10_000), 4, reads or [], 20_000, TUMBLING)
    assert state.first_offsets == {20_000: {0: 5}, 30_000: {1: 2}}
    assert state.markers == {0: 25_000}


def test_a_closing_job_that_did_not_see_every_row_it_must_learn_leaves_the_headers_to_a_pass() -> None:
    watch = HeaderWatch({0: (3, 10)}, (20_000, 30_000))
    complete = _metrics(watch, rows_0=7)
    assert watch.reads(complete, needed={0: (3, 10)}) is not None
    # A query's own action over part of the rows completed the observation early.
    assert watch.reads(_metrics(watch, rows_0=2), needed={0: (3, 10)}) is None
    # A row of a bucket past the watched ones: its first offset would be lost.
    assert watch.reads(_metrics(watch, rows_0=7, ahead_0=1), needed={0: (3, 10)}) is None
    # Rows the batch must learn that the job did not read: another partition, or before its range.
    assert watch.reads(complete, needed={0: (3, 10), 1: (0, 5)}) is None
    assert watch.reads(complete, needed={0: (1, 10)}) is None
    assert watch.reads(complete, needed={0: (3, 10), 1: (5, 5)}) is not None  # nothing to learn there


class _Future:
    def __init__(self, completed: bool) -> None:
        self.completed = completed

    def isCompleted(self) -> bool:
        return self.completed


class _Observation:
    """An observation as the JVM answers it: done or not, and its metrics, or Spark's error reading them."""

    def __init__(self, completed: bool, metrics: dict[str, int] | None) -> None:
        future = _Future(completed)
        self._jo = type("JvmObservation", (), {"future": lambda _self: future})()
        self._metrics = metrics

    @property
    def get(self) -> dict[str, int]:
        if self._metrics is None:
            # What Spark 4.2 does when the action that completed it held no metrics (a pruned plan).
            raise Py4JError("An error occurred while calling o1.getRow: java.lang.AssertionError")
        return self._metrics


def test_a_closing_job_whose_metrics_cannot_be_read_leaves_the_headers_to_a_pass() -> None:
    fake: Any = _Observation(True, {"rows_0": 3})
    assert _observed(fake) == {"rows_0": 3}
    pruned: Any = _Observation(True, None)
    assert _observed(pruned) is None, "an error reading them is no metrics, never a failed batch"
