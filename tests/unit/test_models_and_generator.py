import itertools

import pytest

from contract.errors import ConfigError
from contract.models import GraphProgress, NodePosition, RoutingPlan, ServiceState
from execution_graph.errors import QueryRejected
from execution_graph.validation import check_cuttable
from service_sink.audit import Result, audit
from service_sink.progress import parse_spark_time
from tools.generator import GeneratorSpec, events


def test_models_round_trip_through_json() -> None:
    state = ServiceState(last_batch=7, watermark=5, partitions={"0": NodePosition(window_end=10, event_time=9)})
    assert ServiceState.model_validate_json(state.model_dump_json()) == state
    plan = RoutingPlan(batch_id=3, target_query="q", target_topic="t", late_before=4)
    assert RoutingPlan.model_validate_json(plan.model_dump_json()) == plan
    assert state.max_window_end == 10


def test_progress_times_from_spark_are_epoch_ms() -> None:
    assert parse_spark_time("2023-11-14T22:13:20.000Z") == 1_700_000_000_000
    assert parse_spark_time(None) is None
    assert GraphProgress(query_id="q").committed_batch == -1


def test_same_seed_same_sequence() -> None:
    spec = GeneratorSpec(rate=100, keys=3, seed=9, count=50, disorder_ms=300, late_fraction=0.1)
    assert list(events(spec, 1_000_000)) == list(events(spec, 1_000_000))
    other = GeneratorSpec(rate=100, keys=3, seed=10, count=50, disorder_ms=300, late_fraction=0.1)
    assert list(events(spec, 1_000_000)) != list(events(other, 1_000_000))


def test_event_time_follows_rate_and_time_scale_within_the_disorder_bound() -> None:
    spec = GeneratorSpec(rate=10, keys=2, seed=1, count=100, disorder_ms=50, time_scale=5)
    produced = list(events(spec, 0))
    assert len(produced) == 100
    for i, event in enumerate(produced):
        base = int(i * 5 * 1000 / 10)
        assert base - 50 <= event.ts <= base


def test_late_events_are_behind_by_the_configured_amount() -> None:
    spec = GeneratorSpec(rate=10, seed=2, count=200, late_fraction=0.25, late_by_ms=60_000)
    produced = list(events(spec, 10_000_000))
    late = [e for i, e in enumerate(produced) if e.ts < 10_000_000 + i * 100 - 1000]
    assert 25 < len(late) < 75


@pytest.mark.parametrize("bad", [{"rate": 0}, {"keys": 0}, {"late_fraction": 2.0}, {"time_scale": -1.0}])
def test_generator_refuses_impossible_specs(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        GeneratorSpec(**bad)  # type: ignore[arg-type]


def test_duration_is_turned_into_a_count() -> None:
    assert GeneratorSpec(rate=50, duration_s=4).limit == 200
    assert GeneratorSpec(rate=50).limit is None


@pytest.mark.parametrize(("old", "new"), [(10_000, 30_000), (30_000, 10_000), (20_000, 30_000), (10_000, 10_000)])
def test_window_sizes_with_a_near_common_boundary_can_be_cut(old: int, new: int) -> None:
    check_cuttable(old, new)


def test_window_sizes_whose_common_boundary_is_far_away_are_refused() -> None:
    with pytest.raises(QueryRejected, match="share a boundary only every"):
        check_cuttable(999, 1_000)


def result(key: str, query_id: str, start: int, size: int = 10) -> Result:
    return Result(key=f"{start}|{key}", query_id=query_id, window_start=start, window_end=start + size, row={})


def test_audit_counts_windows_per_version_and_finds_gaps_and_duplicates() -> None:
    clean = [result("a", "v1", 0), result("b", "v1", 0), result("a", "v1", 10), result("a", "v2", 20, 30)]
    report = audit(clean)
    assert report.ok
    assert report.windows_by_query == {"v1": 2, "v2": 1}
    gap = audit([result("a", "v1", 0), result("a", "v1", 20)])
    assert gap.missing_windows == [(10, 20)]
    dup = audit([result("a", "v1", 0), result("a", "v1", 0)])
    assert dup.duplicate_results == 1
    overlap = audit([result("a", "v1", 0), result("b", "v2", 0, 30)])
    assert overlap.overlapping_windows == 1


def test_the_executor_lifecycle_only_moves_forward() -> None:
    from contract.models import EXECUTOR_TRANSITIONS, ExecutorPhase

    order = [ExecutorPhase.STOPPED, ExecutorPhase.BOOTSTRAPPING, ExecutorPhase.RUNNING, ExecutorPhase.STOPPING]
    for current, target in itertools.pairwise([*order, ExecutorPhase.STOPPED]):
        assert target in EXECUTOR_TRANSITIONS[current]
    assert ExecutorPhase.RUNNING not in EXECUTOR_TRANSITIONS[ExecutorPhase.STOPPED]
