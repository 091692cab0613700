"""A live service batch ends just after the next window can close (service_graph/pacing.py)."""

from __future__ import annotations

from hotswap.service_graph.pacing import ARRIVAL_MARGIN_MS, BatchPace

PACE = BatchPace(interval_ms=500, grid_ms=10_000, max_rows=20_000)
LATENESS = 2_000
W = 1_800_000_010_000  # a window end; W + LATENESS lies on the trigger's grid


def test_a_batch_before_a_window_closes_waits_for_the_event_that_closes_it() -> None:
    # The batch began at W + lateness - 500 (a trigger), as events of W + lateness - 510 were
    # the newest; the next trigger, at W + lateness, would come a few ms before the closing event.
    began = W + LATENESS - 500
    watermark = began - 10 - LATENESS
    pause = PACE.pause_ms(began_ms=began, now_ms=began + 300, watermark=watermark, read=250, partitions=2)
    due = began + (W + 1 - watermark) + ARRIVAL_MARGIN_MS
    assert pause == due - (began + 300)
    assert began + 300 + pause > W + LATENESS  # the next batch starts after the closing event


def test_a_batch_whose_next_trigger_reads_the_closing_event_does_not_wait() -> None:
    began = W + LATENESS - 1_000
    watermark = W - 1_010
    assert PACE.pause_ms(began_ms=began, now_ms=began + 300, watermark=watermark, read=250, partitions=2) == 0


def test_a_backlog_batch_never_waits() -> None:
    began = W + LATENESS - 500
    watermark = began - 10 - LATENESS
    assert PACE.pause_ms(began_ms=began, now_ms=began + 300, watermark=watermark, read=20_000, partitions=2) == 0
    # Spark rounds each partition's share of the cap down: 19,999 of 20,000 is a capped batch too.
    assert PACE.pause_ms(began_ms=began, now_ms=began + 300, watermark=watermark, read=19_999, partitions=2) == 0
    assert PACE.pause_ms(began_ms=began, now_ms=began + 300, watermark=watermark, read=19_997, partitions=2) > 0


def test_no_rows_or_no_watermark_never_waits() -> None:
    began = W + LATENESS - 500
    assert PACE.pause_ms(began_ms=began, now_ms=began + 300, watermark=None, read=250, partitions=2) == 0
    assert PACE.pause_ms(began_ms=began, now_ms=began + 300, watermark=W - 10, read=0, partitions=2) == 0


def test_a_pause_is_never_longer_than_one_interval() -> None:
    # Events lag: the closing event is due far beyond the next trigger and the one after it.
    began = W + LATENESS - 500
    watermark = W - 2_000
    assert PACE.pause_ms(began_ms=began, now_ms=began + 300, watermark=watermark, read=250, partitions=2) == 0
    for lag in range(0, 3_000, 7):
        pause = PACE.pause_ms(began_ms=began, now_ms=began + 300, watermark=W - lag, read=250, partitions=2)
        assert 0 <= pause <= PACE.interval_ms


def test_a_batch_that_ends_after_the_due_moment_does_not_wait() -> None:
    began = W + LATENESS - 500
    watermark = began - 10 - LATENESS
    assert PACE.pause_ms(began_ms=began, now_ms=W + LATENESS + 200, watermark=watermark, read=250, partitions=2) == 0


def test_a_watermark_on_a_window_end_still_waits_for_that_window() -> None:
    # At exactly W the window ending at W is not closed yet: one more millisecond of event time is.
    began = W + LATENESS - 20  # a batch that began late: the next trigger is at W + lateness
    pause = PACE.pause_ms(began_ms=began, now_ms=began + 20, watermark=W, read=250, partitions=2)
    assert pause == began + 1 + ARRIVAL_MARGIN_MS - (began + 20)
