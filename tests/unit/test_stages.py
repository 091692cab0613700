"""The stage-timing recorder the product calls and the benchmark reads (hotswap.contract.stages)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import capture_logs

from hotswap.contract import stages


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    stages.reset()
    yield
    stages.reset()


def test_medians_per_query_and_stage() -> None:
    for seconds in (0.3, 0.1, 0.2):
        stages.record("service", "write", seconds)
    stages.record("service", "plan", 0.05)
    stages.record("graph.q1", "write", 1.0)
    stages.record("graph.q1", "write", 2.0)
    assert stages.medians() == {"service": {"write": 0.2, "plan": 0.05}, "graph.q1": {"write": 1.5}}
    assert stages.snapshot()["service"]["write"] == [0.3, 0.1, 0.2]


def test_memory_is_bounded_to_the_latest_samples() -> None:
    for i in range(stages.SAMPLES_KEPT + 500):
        stages.record("service", "batch", float(i))
    kept = stages.snapshot()["service"]["batch"]
    assert len(kept) == stages.SAMPLES_KEPT
    assert kept[0] == 500.0
    assert kept[-1] == float(stages.SAMPLES_KEPT + 499)


def test_snapshot_is_a_copy() -> None:
    stages.record("service", "batch", 1.0)
    stages.snapshot()["service"]["batch"].append(99.0)
    assert stages.snapshot() == {"service": {"batch": [1.0]}}


def test_reset_forgets_everything() -> None:
    stages.record("service", "batch", 1.0)
    stages.reset()
    assert stages.snapshot() == {}
    assert stages.medians() == {}


def test_concurrent_recording_loses_no_sample() -> None:
    def work(n: int) -> None:
        for _ in range(200):
            stages.record("service", f"stage{n % 2}", 0.001)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    snap = stages.snapshot()["service"]
    assert len(snap["stage0"]) == len(snap["stage1"]) == 800


def test_timed_records_the_elapsed_time_and_logs_it_at_debug() -> None:
    # Debug lines pass whatever level an earlier test configured; that configuration comes back after.
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(0))
    try:
        with capture_logs() as logs, stages.timed("service", "write"):
            pass
    finally:
        structlog.configure(**before)
    [seconds] = stages.snapshot()["service"]["write"]
    assert 0.0 <= seconds < 1.0
    assert logs == [
        {
            "event": "stage timed",
            "log_level": "debug",
            "query": "service",
            "stage": "write",
            "seconds": logs[0]["seconds"],
        }
    ]


def test_timed_records_a_step_that_raised() -> None:
    with pytest.raises(RuntimeError), stages.timed("service", "write"):
        raise RuntimeError("broker down")
    assert len(stages.snapshot()["service"]["write"]) == 1
