"""The closing engine's state: when a window closes, and where its rows are (execution_graph.closing)."""

from __future__ import annotations

import random
from typing import Any

from py4j.protocol import Py4JError
from pyspark.sql import Row

from hotswap.contract.observed import OBSERVED
from hotswap.contract.windows import Windowing
from hotswap.execution_graph.closing import (
    MAX_AHEAD_BUCKETS,
    ClosingState,
    HeaderWatch,
    PartitionRead,
    _observed,
    _spanning,
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
    """Metrics as `_observed` hands them on (Spark's one observed column, flattened): every aggregate
    named, those not given as an empty read has them."""
    names = [e.rsplit(" AS ", 1)[1] for e in watch.aggregates()]
    empty = {n: (0 if n.startswith("rows_") else None) for n in names}
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
    watch = HeaderWatch({0: (3, 10), 1: (0, 4)}, (20_000, 30_000), 10_000)
    metrics = _metrics(watch, rows_0=7, rows_1=4, marker_0=25_000, first_0_0=5, first_1_1=2)
    reads = watch.reads(metrics, needed={0: (6, 10), 1: (0, 4)})
    assert reads == [
        PartitionRead(0, marker=25_000, first_offsets={20_000: 5}, since=3),
        PartitionRead(1, marker=None, first_offsets={30_000: 2}, since=0),
    ]
    state = advance(ClosingState(closed_through=10_000), 4, reads or [], 20_000, TUMBLING)
    assert state.first_offsets == {20_000: {0: 5}, 30_000: {1: 2}}
    assert state.markers == {0: 25_000}


def test_a_closing_job_that_did_not_see_every_row_it_must_learn_leaves_the_headers_to_a_pass() -> None:
    watch = HeaderWatch({0: (3, 10)}, (20_000, 30_000), 10_000)
    complete = _metrics(watch, rows_0=7)
    assert watch.reads(complete, needed={0: (3, 10)}) is not None
    # A query's own action over part of the rows completed the observation early.
    assert watch.reads(_metrics(watch, rows_0=2), needed={0: (3, 10)}) is None
    # Rows far ahead (a jump in event time): more buckets past the watched ones than a watch covers.
    jump = _metrics(watch, rows_0=7, ahead_first_0=9, ahead_last_0=30_000 + (MAX_AHEAD_BUCKETS + 1) * 10_000)
    assert watch.reads(jump, needed={0: (3, 10)}) is None
    # Rows the batch must learn that the job did not read: another partition, or before its range.
    assert watch.reads(complete, needed={0: (3, 10), 1: (0, 5)}) is None
    assert watch.reads(complete, needed={0: (1, 10)}) is None
    assert watch.reads(complete, needed={0: (3, 10), 1: (5, 5)}) is not None  # nothing to learn there


def test_rows_past_the_watched_buckets_begin_no_later_than_the_first_of_them_and_a_later_read_finds_their_own() -> None:
    watch = HeaderWatch({0: (3, 20)}, (20_000, 30_000), 10_000)
    # A backlog's batch: rows of the buckets 40 s and 50 s, the first of them at offset 12.
    metrics = _metrics(watch, rows_0=17, first_0_0=3, first_0_1=8, ahead_first_0=12, ahead_last_0=50_000)
    reads = watch.reads(metrics, needed={0: (3, 20)})
    assert reads == [
        PartitionRead(0, first_offsets={20_000: 3, 30_000: 8, 40_000: 12, 50_000: 12}, since=3),
    ]
    state = advance(ClosingState(closed_through=20_000), 0, reads or [], None, TUMBLING)
    assert state.first_offsets[50_000] == {0: 12}
    # A later job whose range begins before 12 watches 40 s and 50 s themselves: 50 s begins at 16.
    state = advance(state, 1, [PartitionRead(0, first_offsets={40_000: 12, 50_000: 16}, since=8)], 40_000, TUMBLING)
    assert state.first_offsets == {40_000: {0: 12}, 50_000: {0: 16}}
    # A read that began after a bucket's first row cannot move it.
    state = advance(state, 2, [PartitionRead(0, first_offsets={50_000: 30}, since=25)], None, TUMBLING)
    assert state.first_offsets[50_000] == {0: 16}


def test_no_row_of_a_closing_window_lies_before_where_its_job_reads() -> None:
    """Backlogs read in batches that each span several windows, over one to three partitions: event
    times in order or out of order by up to two seconds, now and then a jump ahead or a row written
    twice (a replayed service batch), each batch closing as far as every partition's rows allow, or
    less, or nothing, through the same branches as WindowCloser.run (watch, rows left unread, headers
    pass, and, for a graph that owns only the windows after a cut, no job for the windows up to it,
    their rows deferred). Every recorded first offset stays at or before its bucket's first row, and
    every close job's range starts at or before every row of the windows it closes (an oracle over
    the rows)."""
    rng = random.Random(29)
    deferrals = 0
    for trial in range(120):
        windowing = (TUMBLING, SLIDING)[trial % 2]
        partitions = rng.randint(1, 3)
        disorder = rng.choice((0, 0, 200, 2_000))
        rows = [_backlog(rng, disorder) for _ in range(partitions)]
        owned_after = rng.choice((None, rng.randrange(0, 40_000, windowing.slide_ms)))
        deferrals += _replay_backlog(rows, rng.choice((200, 500, 1_200)), windowing, rng, owned_after)
    assert deferrals > 0, "some batches closed only windows the graph does not own"


def _backlog(rng: random.Random, disorder: int) -> list[int]:
    """One partition's event times, by offset."""
    times: list[int] = []
    t = 0
    while len(times) < 2_000:
        t += rng.randint(0, 40)
        if rng.random() < 0.002:
            t += rng.choice((35_000, 90_000, 4_000_000))  # a jump ahead, sometimes past what a watch spans
        times.append(max(0, t - rng.randint(0, disorder)))
        if rng.random() < 0.01:
            times.extend(rng.sample(times[-50:], k=min(5, len(times))))  # rows written again
    return times


def _replay_backlog(
    rows: list[list[int]], cap: int, windowing: Windowing, rng: random.Random, owned_after: int | None = None
) -> int:
    """Replays the batches; returns how many deferred their rows."""
    slide, size = windowing.slide_ms, windowing.size_ms
    buckets = [[t - t % slide for t in times] for times in rows]
    firsts_of = [{b: buckets[p].index(b) for b in set(buckets[p])} for p in range(len(rows))]
    state, start = ClosingState(), dict.fromkeys(range(len(rows)), 0)
    deferrals = 0
    while any(start[p] < len(times) for p, times in enumerate(rows)):
        end = {p: min(len(times), start[p] + cap) for p, times in enumerate(rows)}
        # As far as the markers let it close: every row of the windows closed is before `end`.
        complete = min(
            (min(times[end[p] :], default=max(times) + size) // slide * slide for p, times in enumerate(rows)),
        )
        through: int | None = complete
        if state.closed_through is not None and rng.random() < 0.6:  # markers not known yet: close less, or none
            through = min(complete, state.closed_through + rng.randint(0, 3) * slide)
        offsets = {p: (start[p], end[p]) for p in end if end[p] > start[p]}
        watched: list[PartitionRead] | None = None
        unowned = False
        if through is not None and (state.closed_through is None or through > state.closed_through):
            closing = closing_for(state, through, start, end, windowing)
            unowned = owned_after is not None and through <= owned_after
        if unowned:
            pass  # no job: nothing it closes is this graph's
        elif through is not None and (state.closed_through is None or through > state.closed_through):
            since = None if closing.after is None else closing.after + slide - size
            for p, times in enumerate(rows):
                owed = [o for o in range(end[p]) if (since is None or times[o] >= since) and times[o] < through]
                if owed:
                    assert closing.offsets[p][0] <= min(owed), (closing, p, min(owed))
            watch = HeaderWatch.for_closing(closing, windowing)
            if watch is not None and rng.random() < 0.9:  # else: the observation came back incomplete
                metrics: dict[str, int | None] = {}
                for p, (begin, stop) in closing.offsets.items():
                    seen = range(begin, stop)
                    metrics[f"rows_{p}"] = len(seen)
                    for i, bucket in enumerate(watch.buckets):
                        mine = [o for o in seen if buckets[p][o] == bucket]
                        metrics[f"first_{p}_{i}"] = min(mine) if mine else None
                    ahead = [o for o in seen if buckets[p][o] > watch.buckets[-1]]
                    metrics[f"ahead_first_{p}"] = min(ahead) if ahead else None
                    metrics[f"ahead_last_{p}"] = max(buckets[p][o] for o in ahead) if ahead else None
                watched = watch.reads(metrics, _spanning(state.unread, offsets))
        else:
            through = None
        reads: list[PartitionRead] = []
        unread: dict[int, tuple[int, int]] = {}
        deferred = False
        if watched is not None:
            reads = watched
        elif unowned and (state.deferred or not state.unread):
            unread, deferred = _spanning(state.unread, offsets), True
            deferrals += 1
        elif through is not None and not state.unread:
            unread = offsets
        else:
            for p, (begin, _) in state.unread.items():
                offsets[p] = (min(begin, offsets.get(p, (begin, 0))[0]), end[p])
            for p, (begin, stop) in offsets.items():
                firsts: dict[int, int] = {}
                for o in range(begin, stop):
                    firsts.setdefault(buckets[p][o], o)
                reads.append(PartitionRead(p, first_offsets=firsts, since=begin))
        state = advance(state, 0, reads, through, windowing, unread, deferred=deferred)
        for bucket, parts in state.first_offsets.items():
            for p, offset in parts.items():
                first = firsts_of[p].get(bucket)
                assert first is None or offset <= first, (bucket, p, offset, first)
        start = end
    return deferrals


class _Future:
    def __init__(self, completed: bool) -> None:
        self.completed = completed

    def isCompleted(self) -> bool:
        return self.completed


class _Observation:
    """An observation as the JVM answers it: done or not, and its metrics, or Spark's error reading them."""

    def __init__(self, completed: bool, metrics: dict[str, Any] | None) -> None:
        future = _Future(completed)
        self._jo = type("JvmObservation", (), {"future": lambda _self: future})()
        self._metrics = metrics

    @property
    def get(self) -> dict[str, Any]:
        if self._metrics is None:
            # What Spark 4.2 does when the action that completed it held no metrics (a pruned plan).
            raise Py4JError("An error occurred while calling o1.getRow: java.lang.AssertionError")
        return self._metrics


def test_a_closing_job_whose_metrics_cannot_be_read_leaves_the_headers_to_a_pass() -> None:
    fake: Any = _Observation(True, {OBSERVED: Row(rows_0=3)})
    assert _observed(fake) == {"rows_0": 3}
    without: Any = _Observation(True, {})
    assert _observed(without) is None, "an answer without the observed column is no metrics"
    pruned: Any = _Observation(True, None)
    assert _observed(pruned) is None, "an error reading them is no metrics, never a failed batch"
