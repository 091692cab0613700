import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import fastavro
import pytest
from kafka import KafkaProducer

from hotswap.contract.errors import ConfigError
from hotswap.execution_graph.errors import QueryRejected
from hotswap.execution_graph.validation import check_cuttable
from hotswap.executor.tools.generator import (
    EVENTS_AVRO,
    ORDERS_AVRO,
    Encoding,
    GeneratorSpec,
    Profile,
    events,
    generate,
    record_partition,
)
from hotswap.service_sink.audit import Result, audit
from hotswap.service_sink.progress import parse_spark_time

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_progress_times_from_spark_are_epoch_ms() -> None:
    assert parse_spark_time("2023-11-14T22:13:20.000Z") == 1_700_000_000_000
    assert parse_spark_time(None) is None


def test_same_seed_same_sequence() -> None:
    spec = GeneratorSpec(rate=100, keys=3, seed=9, count=50, disorder_ms=300, late_fraction=0.1)
    assert list(events(spec, 1_000_000)) == list(events(spec, 1_000_000))
    other = GeneratorSpec(rate=100, keys=3, seed=10, count=50, disorder_ms=300, late_fraction=0.1)
    assert list(events(spec, 1_000_000)) != list(events(other, 1_000_000))


def test_time_scale_stretches_event_time_per_second_of_sending() -> None:
    # 100 events at 10 per second take 10 s to send; at time scale 5 they cover about 50 s of event time.
    spec = GeneratorSpec(rate=10, keys=2, seed=1, count=100, time_scale=5)
    stamps = [event.ts for event in events(spec, 0)]
    assert len(stamps) == 100
    assert stamps == sorted(stamps)  # no disorder asked for, none given
    assert 49_000 <= stamps[-1] - stamps[0] <= 50_000


def test_disordered_events_are_never_further_behind_than_the_disorder_bound() -> None:
    spec = GeneratorSpec(rate=10, keys=2, seed=1, count=200, disorder_ms=300)
    stamps = [event.ts for event in events(spec, 1_000_000)]
    behind = [max(stamps[:i]) - ts for i, ts in enumerate(stamps) if i]
    assert max(behind) > 0  # some events do arrive out of order
    assert max(behind) <= 300
    assert min(stamps) >= 1_000_000 - 300


def test_late_events_are_behind_by_the_configured_amount() -> None:
    start, late_by = 10_000_000, 60_000
    spec = GeneratorSpec(rate=10, seed=2, count=200, late_fraction=0.25, late_by_ms=late_by)
    stamps = [event.ts for event in events(spec, start)]
    # 200 events at 10 per second span 20 s of event time; late ones lie a minute before that span.
    on_time = [ts for ts in stamps if start <= ts < start + 20_000]
    late = [ts for ts in stamps if start - late_by <= ts < start - late_by + 20_000]
    assert len(on_time) + len(late) == len(stamps)
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


def test_the_generator_writes_the_avro_schemas_the_examples_declare() -> None:
    assert json.loads((EXAMPLES / "orders.avsc").read_text()) == ORDERS_AVRO
    assert json.loads((EXAMPLES / "events.avsc").read_text()) == EVENTS_AVRO


def test_orders_are_seeded_nested_and_stamped_in_mixed_utc_offsets() -> None:
    spec = GeneratorSpec(rate=100, count=400, keys=20, seed=3, profile=Profile.ORDERS, disorder_ms=200)
    first = list(generate(spec, 1_700_000_000_000))
    assert first == list(generate(spec, 1_700_000_000_000))
    bodies = [json.loads(g.value) for g in first]
    assert {b["created_at"][-1] == "Z" or b["created_at"][-6:] for b in bodies} == {True, "+01:00", "-05:00", "+05:30"}
    for g, body in zip(first, bodies, strict=True):
        moment = datetime.fromisoformat(body["created_at"])
        assert (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1) == g.ts
        assert set(body) == {"order_id", "customer", "amount", "status", "channel", "created_at"}
        assert g.key == body["order_id"].encode()


def test_avro_orders_are_confluent_framed_records_of_the_example_schema() -> None:
    spec = GeneratorSpec(rate=100, count=50, profile=Profile.ORDERS, encoding=Encoding.AVRO, schema_id=7)
    schema = fastavro.parse_schema(json.loads((EXAMPLES / "orders.avsc").read_text()))
    for g in generate(spec, 1_700_000_000_000):
        assert g.value[:5] == b"\x00\x00\x00\x00\x07"
        record = fastavro.schemaless_reader(io.BytesIO(g.value[5:]), schema)
        assert isinstance(record, dict)
        assert record["order_id"] == g.key.decode()
        assert (record["created_at"] - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1) == g.ts


class _Metadata:
    """The one thing `record_partition` asks of a producer: the topic's partitions, as Kafka's metadata has them."""

    def __init__(self, partitions: set[int]) -> None:
        self.partitions = partitions

    def partitions_for(self, topic: str) -> set[int]:
        return self.partitions


def test_a_few_keys_fill_every_partition_and_each_key_keeps_to_one() -> None:
    """Kafka's hash put k0, k1 and k2 all in partition 1 of 2: a test with three keys left partition 0 empty."""
    spec = GeneratorSpec(rate=100, count=300, keys=3, seed=5)
    for count in (1, 2, 4):
        producer = cast(KafkaProducer, _Metadata(set(range(count))))
        where: dict[bytes, set[int | None]] = {}
        for g in generate(spec, 1_700_000_000_000):
            where.setdefault(g.key, set()).add(record_partition(producer, "events", g))
        assert all(len(partitions) == 1 for partitions in where.values())  # each key in order, in one partition
        assert set().union(*where.values()) == set(range(min(count, 3)))
    orders = GeneratorSpec(rate=100, count=10, profile=Profile.ORDERS)
    assert {record_partition(cast(KafkaProducer, _Metadata({0, 1})), "o", g) for g in generate(orders, 0)} == {None}
