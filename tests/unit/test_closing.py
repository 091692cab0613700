"""The closing engine's state: when a window closes, and where its rows are (execution_graph.closing)."""

from __future__ import annotations

from hotswap.contract.windows import Windowing
from hotswap.execution_graph.closing import ClosingState, PartitionRead, advance

TUMBLING = Windowing(10_000, 10_000)
SLIDING = Windowing(30_000, 10_000)


def test_a_window_closes_only_once_every_partition_has_read_a_marker_past_it() -> None:
    state, closing = advance(
        ClosingState(),
        0,
        [
            PartitionRead(0, end=5, marker=20_000, first_offsets={10_000: 0}),
            PartitionRead(1, end=3, first_offsets={10_000: 1}),  # rows, but no marker yet (row cap)
        ],
        partitions=2,
        windowing=TUMBLING,
    )
    assert closing is None
    assert state.closed_through is None
    state, closing = advance(state, 1, [PartitionRead(1, end=9, marker=20_000)], partitions=2, windowing=TUMBLING)
    assert closing is not None
    assert (closing.after, closing.through) == (None, 20_000)
    assert closing.offsets == {0: (0, 5), 1: (1, 9)}


def test_the_graph_closes_through_the_minimum_marker_not_the_maximum() -> None:
    reads = [
        PartitionRead(0, end=10, marker=60_000, first_offsets={40_000: 2}),
        PartitionRead(1, end=10, marker=30_000, first_offsets={20_000: 1}),
        PartitionRead(2, end=1, marker=40_000),  # an empty partition: markers only
        PartitionRead(3, end=1, marker=50_000),
    ]
    state, closing = advance(ClosingState(), 0, reads, partitions=4, windowing=TUMBLING)
    assert state.closed_through == 30_000
    assert closing is not None
    assert closing.through == 30_000


def test_a_partition_never_read_holds_every_window_open() -> None:
    state, closing = advance(
        ClosingState(), 0, [PartitionRead(0, end=3, marker=100_000)], partitions=2, windowing=TUMBLING
    )
    assert closing is None
    assert state.closed_through is None


def test_closing_never_moves_back_and_closes_each_window_once() -> None:
    state, first = advance(
        ClosingState(),
        0,
        [PartitionRead(0, end=4, marker=20_000, first_offsets={10_000: 0, 20_000: 2})],
        partitions=1,
        windowing=TUMBLING,
    )
    assert first is not None
    assert first.through == 20_000
    # An older marker read again (a marker sent twice): nothing closes.
    state, again = advance(state, 1, [PartitionRead(0, end=5, marker=10_000)], partitions=1, windowing=TUMBLING)
    assert again is None
    assert state.closed_through == 20_000
    state, second = advance(state, 2, [PartitionRead(0, end=7, marker=30_000)], partitions=1, windowing=TUMBLING)
    assert second is not None
    assert (second.after, second.through) == (20_000, 30_000)
    # Only the rows from the bucket of the window that closes: [20 s, 30 s) starts at offset 2.
    assert second.offsets == {0: (2, 7)}
    assert second.rows_since == 20_000 - 10_000 + 1


def test_a_closed_bucket_is_forgotten_and_its_late_duplicates_too() -> None:
    state, _ = advance(
        ClosingState(),
        0,
        [PartitionRead(0, end=4, marker=20_000, first_offsets={10_000: 0, 20_000: 3})],
        partitions=1,
        windowing=TUMBLING,
    )
    assert set(state.first_offsets) == {20_000}
    # A replayed service batch writes rows of a closed window again, after the marker.
    state, closing = advance(
        state, 1, [PartitionRead(0, end=6, first_offsets={10_000: 4})], partitions=1, windowing=TUMBLING
    )
    assert closing is None
    assert set(state.first_offsets) == {20_000}


def test_a_sliding_window_reads_every_bucket_it_spans() -> None:
    # 30 s windows sliding by 10 s: the window ending at 40 s holds [10 s, 40 s).
    state, _ = advance(
        ClosingState(),
        0,
        [PartitionRead(0, end=9, marker=30_000, first_offsets={10_000: 1, 20_000: 4, 30_000: 7})],
        partitions=1,
        windowing=SLIDING,
    )
    assert set(state.first_offsets) == {10_000, 20_000, 30_000}  # each one is in the window ending at 40 s
    state, closing = advance(state, 1, [PartitionRead(0, end=12, marker=40_000)], partitions=1, windowing=SLIDING)
    assert closing is not None
    assert closing.offsets == {0: (1, 12)}
    assert set(state.first_offsets) == {20_000, 30_000}


def test_the_state_survives_its_file() -> None:
    state, _ = advance(
        ClosingState(),
        3,
        [PartitionRead(1, end=8, marker=20_000, first_offsets={20_000: 5}), PartitionRead(0, end=2, marker=30_000)],
        partitions=2,
        windowing=TUMBLING,
    )
    assert ClosingState.from_json(state.to_json()) == state
