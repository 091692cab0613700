"""A service-graph batch whose read skipped source records Kafka still holds fails before it records
anything, so that Spark replays it; one whose unseen offsets Kafka no longer holds (transaction
markers, compaction, retention) goes on (service_graph/coverage.py)."""

from __future__ import annotations

from collections.abc import Mapping

import fakeredis
import pytest
from kafka.errors import KafkaTimeoutError

from hotswap.contract.models import NodePosition, ServiceState
from hotswap.contract.names import SKIPPED_READS, Keys
from hotswap.contract.outages import KAFKA, Outages
from hotswap.contract.settings import KafkaSettings, Settings
from hotswap.service_graph import query as service_graph_query
from hotswap.service_graph.coverage import PlannedRange, SkippedRead
from hotswap.service_graph.frames import BatchStats
from hotswap.service_graph.kafka_io import RangesAnswer, SourceOffsets
from hotswap.service_graph.query import ServiceGraph
from hotswap.service_graph.routing import PartitionBatchStats
from tests.component.fakes import NO_SPARK

TOPIC = "component.events"


class FakeOffsetLog:
    """Spark's offset log: batch 7 planned partitions 0 and 1 from offset 0 up to offset 600."""

    def batch(self, batch_id: int) -> PlannedRange | None:
        return PlannedRange({0: 0, 1: 0}, {0: 600, 1: 600}) if batch_id == 7 else None


class KafkaHolding(SourceOffsets):
    """The source as Kafka holds it: records at `offsets`, each partition's log from `log_starts`;
    every question asked is kept."""

    def __init__(self, kafka: KafkaSettings, offsets: set[int], log_starts: dict[str, int] | None = None) -> None:
        super().__init__(kafka, TOPIC)
        self.offsets = offsets
        self.log_starts = log_starts or {"0": 0, "1": 0}
        self.asked: list[tuple[int, int, int]] = []

    def first_records(self, ranges: Mapping[int, tuple[int, int]], timeout_s: float) -> RangesAnswer:
        self.asked += [(p, first, end) for p, (first, end) in sorted(ranges.items())]
        found = {}
        for p, (first, end) in ranges.items():
            held = [o for o in self.offsets if max(first, self.log_starts[str(p)]) <= o < end]
            if held:
                found[p] = min(held)
        return RangesAnswer(found, {p: end for p, (_, end) in ranges.items()})

    def log_start(self) -> dict[str, int]:
        return self.log_starts


def service_with(
    holding: set[int], log_starts: dict[str, int] | None = None
) -> tuple[ServiceGraph, KafkaHolding, fakeredis.FakeRedis]:
    settings = Settings(namespace="component", source_topic=TOPIC)
    client = fakeredis.FakeRedis()
    service = ServiceGraph(
        NO_SPARK,
        client,
        pipeline=settings.pipeline,
        kafka=settings.kafka,
        timeouts=settings.timeouts,
        recovery=settings.recovery,
    )
    source = KafkaHolding(settings.kafka, holding, log_starts)
    service._source = source
    service._offset_log = FakeOffsetLog()  # type: ignore[assignment]
    return service, source, client


def saw(*partitions: tuple[int, int, int]) -> BatchStats:
    """A batch's statistics: (partition, min offset, max offset) of what it read."""
    return BatchStats(
        partitions=[
            PartitionBatchStats(
                p, max_offset=hi, min_offset=lo, max_event_time=1, max_window_end=1, late=0, dead_letter=0
            )
            for p, lo, hi in partitions
        ]
    )


def test_a_batch_that_read_its_whole_plan_asks_kafka_nothing() -> None:
    service, source, _ = service_with(set(range(600)))
    service._account_for_reads(7, ServiceState(), saw((0, 0, 599), (1, 0, 599)))
    assert source.asked == []


def test_a_partition_whose_rows_never_reached_the_batch_fails_it_and_is_counted() -> None:
    service, source, client = service_with(set(range(600)))
    with pytest.raises(SkippedRead) as failed:
        service._account_for_reads(7, ServiceState(), saw((0, 0, 599)))
    assert source.asked == [(1, 0, 600)]
    assert str(failed.value) == (
        "batch 7 did not read partition 1 [0, 600) of component.events, where Kafka holds records (offset 0); "
        "the batch is replayed"
    )
    assert client.hget(Keys("component").counters, SKIPPED_READS) == b"1"


def test_unseen_offsets_kafka_holds_no_record_at_are_not_a_loss() -> None:
    # Partition 1's tail is a transaction's commit marker; partition 0 was read before this batch.
    service, source, client = service_with(set(range(599)))
    before = ServiceState(last_batch=6, partitions={"0": NodePosition(offset=599)})
    service._account_for_reads(7, before, saw((1, 0, 598)))
    assert source.asked == [(1, 599, 600)]
    assert client.hget(Keys("component").counters, SKIPPED_READS) is None


def test_a_batch_spark_has_no_offset_log_entry_for_is_not_checked() -> None:
    service, source, _ = service_with(set(range(600)))
    service._account_for_reads(8, ServiceState(), saw())
    assert source.asked == []


def test_offsets_kafka_said_hold_no_record_are_asked_about_once() -> None:
    service, source, _ = service_with(set(range(599)))
    before = ServiceState(last_batch=6, partitions={"0": NodePosition(offset=599), "1": NodePosition(offset=598)})
    service._account_for_reads(7, before, saw())
    service._account_for_reads(7, before, saw())  # the next batch plans the same ends: a quiet source
    assert source.asked == [(1, 599, 600)]


def test_rows_retention_deleted_before_the_batch_read_them_are_counted_as_expired() -> None:
    # Partition 0 lost [0, 250) to retention and the batch read from 250; partition 1 lost all of its
    # range, so the batch read no row of it: both count.
    service, source, _ = service_with(set(range(250, 600)) | set(range(600, 700)), {"0": 250, "1": 700})
    assert service._account_for_reads(7, ServiceState(), saw((0, 250, 599))) == 250 + 600
    assert source.asked == [(1, 0, 600)]


class KafkaAway(KafkaHolding):
    def first_records(self, ranges: Mapping[int, tuple[int, int]], timeout_s: float) -> RangesAnswer:
        raise KafkaTimeoutError(f"no answer from Kafka on {TOPIC} within {timeout_s:g} s")


def test_a_batch_kafka_cannot_be_asked_about_fails_in_one_line_and_is_replayed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outages = Outages()  # the process's own outage record stays as it is
    monkeypatch.setattr(service_graph_query, "OUTAGES", outages)
    service, _, client = service_with(set())
    service._source = KafkaAway(service._kafka, set())
    with pytest.raises(SkippedRead) as failed:
        service._account_for_reads(7, ServiceState(), saw((0, 0, 599)))
    assert str(failed.value) == (
        "batch 7 did not read partition 1 [0, 600) of component.events, and Kafka did not say whether records are "
        "there (KafkaTimeoutError); the batch is replayed: check the brokers"
    )
    assert outages.is_down(KAFKA)
    assert client.hget(Keys("component").counters, SKIPPED_READS) is None
