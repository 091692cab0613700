"""The service graph's own Kafka clients, outside Spark: Kafka's view of the source topic, and the
producer of watermark markers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import structlog
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError

from hotswap.contract.envelope import ROUTE_HEADER, marker_route
from hotswap.contract.outages import KAFKA, OUTAGES
from hotswap.contract.settings import KafkaSettings
from hotswap.contract.windows import marker_event_time
from hotswap.service_graph.routing import Marker

log = structlog.get_logger(__name__)

MARKER_KEY = b"__hotswap_marker__"

# Told, on the producer's thread, that every partition of a topic took a marker: (topic, watermark,
# partition -> the marker's offset there). It must return at once.
MarkerTaken = Callable[[str, int, Mapping[int, int]], None]


class Placed(Protocol):
    """Where Kafka put a record (kafka-python's RecordMetadata)."""

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...


@dataclass(frozen=True)
class RangesAnswer:
    """What Kafka said of offset ranges (SourceOffsets.first_records), by partition: the first
    record's offset where it holds one, and how far it could look (its log's end, if before)."""

    found: dict[int, int]
    checked_to: dict[int, int]


class SourceOffsets:
    """Kafka's view of the source topic: what is waiting (end offsets) and what is left (log start)."""

    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        self._kafka = kafka
        self._topic = topic
        self._consumer: KafkaConsumer | None = None
        self._reader: KafkaConsumer | None = None  # reads records (first_record)

    def _parts(self) -> tuple[KafkaConsumer, list[TopicPartition]]:
        if self._consumer is None:
            self._consumer = KafkaConsumer(**self._kafka.kafka_python_config(), enable_auto_commit=False)
        topic = self._topic
        parts = [TopicPartition(topic, p) for p in sorted(self._consumer.partitions_for_topic(topic) or [])]
        return self._consumer, parts

    def partition_count(self) -> int:
        """How many partitions the source topic has now (0 if it does not exist yet)."""
        _, parts = self._parts()
        return len(parts)

    def end(self) -> dict[str, int]:
        consumer, parts = self._parts()
        return {str(tp.partition): int(o) for tp, o in consumer.end_offsets(parts).items()}

    def log_start(self) -> dict[str, int]:
        consumer, parts = self._parts()
        return {str(tp.partition): int(o) for tp, o in consumer.beginning_offsets(parts).items()}

    def first_records(self, ranges: Mapping[int, tuple[int, int]], timeout_s: float) -> RangesAnswer:
        """Kafka's answer on offset ranges of the source, partition -> [first, end): in each, the
        offset of the first record it holds, if any (none: transaction markers, compacted or expired
        offsets). One pass over every partition, within `timeout_s`; raises KafkaError (a
        KafkaTimeoutError when Kafka is too slow to answer)."""
        deadline = time.monotonic() + timeout_s

        def left_ms() -> int:
            left = deadline - time.monotonic()
            if left <= 0:
                raise KafkaTimeoutError(f"no answer from Kafka on {self._topic} within {timeout_s:g} s")
            return max(1, int(left * 1000))

        if self._reader is None:
            # A consumer of its own, positioned on the ranges; the shared one only asks for offsets.
            # `earliest`: a range retention moves past while it is read gives what is left of it.
            self._reader = KafkaConsumer(
                **self._kafka.kafka_python_config(),
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                bootstrap_timeout_ms=left_ms(),
            )
        reader = self._reader
        parts = {p: TopicPartition(self._topic, p) for p in ranges}
        reader.assign(list(parts.values()))
        if reader.paused():
            reader.resume(*reader.paused())
        ends = reader.end_offsets(list(parts.values()), timeout_ms=left_ms())
        starts = reader.beginning_offsets(list(parts.values()), timeout_ms=left_ms())
        answer = RangesAnswer({}, {})
        open_ranges: dict[TopicPartition, int] = {}
        for partition, (first, end) in ranges.items():
            tp = parts[partition]
            # Kafka holds nothing past its log's end (a truncated log) or below its start (retention).
            answer.checked_to[partition] = min(end, int(ends[tp]))
            if max(first, int(starts[tp])) < answer.checked_to[partition]:
                reader.seek(tp, max(first, int(starts[tp])))
                open_ranges[tp] = answer.checked_to[partition]
            else:
                reader.pause(tp)
        while open_ranges:
            for tp, records in reader.poll(timeout_ms=min(left_ms(), 500)).items():
                if tp in open_ranges and records:
                    if records[0].offset < open_ranges[tp]:
                        answer.found[tp.partition] = int(records[0].offset)
                    del open_ranges[tp]
                    reader.pause(tp)
            for tp in list(open_ranges):
                if reader.position(tp, timeout_ms=left_ms()) >= open_ranges[tp]:
                    del open_ranges[tp]
                    reader.pause(tp)
        return answer

    def close(self) -> None:
        for consumer in (self._consumer, self._reader):
            if consumer is not None:
                consumer.close()
        self._consumer = self._reader = None


class _Awaited:
    """The partitions of one marker whose answer has not come yet, and where the others put it."""

    def __init__(self, partitions: int) -> None:
        self.left = partitions
        self.offsets: dict[int, int] = {}


class MarkerWriter:
    """Writes watermark markers into execution graphs' topics, each at most once per watermark.

    A marker is sent without waiting for Kafka's answer (docs/architecture.md, "Markers"): the rows it
    follows were written by Spark before it is sent, and one producer keeps the markers of a topic in
    order, so nothing waits on the round trip. A marker that never arrives (its send failed, or the
    process died first) is sent again with the next batch or tick, at the watermark of that moment:
    markers only ever move a graph's watermark forward, so a late or repeated one is harmless.
    """

    def __init__(self, kafka: KafkaSettings, on_taken: MarkerTaken | None = None) -> None:
        self._kafka = kafka
        self._on_taken = on_taken
        self._producer: KafkaProducer | None = None
        self._written: dict[str, int] = {}  # topic -> watermark of the last marker Kafka took there
        self._lock = threading.Lock()  # the producer's thread records what Kafka took

    def write(self, markers: list[Marker], *, wait: bool = False) -> None:
        """Send the markers of one batch or tick: `markers` names every graph that still receives them.
        With `wait`, return once Kafka has taken them (used for the end-of-window marker of a drain)."""
        self._forget_retired({m.topic for m in markers})
        with self._lock:
            markers = [m for m in markers if self._written.get(m.topic) != m.watermark]
        if not markers:
            return
        if self._producer is None:
            self._producer = KafkaProducer(**self._kafka.kafka_python_config(), acks="all", linger_ms=0)
        for marker in markers:
            headers = [(ROUTE_HEADER, marker_route(marker_event_time(marker.watermark)))]
            # Every partition gets the marker: each must see the watermark move.
            partitions = sorted(self._producer.partitions_for(marker.topic) or {0})
            awaited = _Awaited(len(partitions))
            for partition in partitions:
                sent = self._producer.send(
                    marker.topic, key=MARKER_KEY, value=b"", headers=headers, partition=partition
                )
                sent.add_callback(self._taken, marker, awaited)
                sent.add_errback(self._refused, marker)
        if wait:
            self._producer.flush(timeout=30)
        log.debug("watermark markers sent", markers=[(m.query_id, m.watermark) for m in markers])

    def _taken(self, marker: Marker, awaited: _Awaited, placed: Placed) -> None:
        # Called on the producer's own thread, once per partition: the marker is written when every
        # partition took it (one refused, and the next batch or tick sends it again to them all).
        OUTAGES.up(KAFKA)
        with self._lock:
            awaited.left -= 1
            awaited.offsets[placed.partition] = placed.offset
            if awaited.left > 0:
                return
            if self._written.get(marker.topic, -1) < marker.watermark:
                self._written[marker.topic] = marker.watermark
        if self._on_taken is not None:
            self._on_taken(marker.topic, marker.watermark, dict(awaited.offsets))

    def _refused(self, marker: Marker, error: BaseException) -> None:
        # Not recorded as written: the next batch or tick sends it again.
        OUTAGES.down(
            KAFKA, f"{type(error).__name__}: {error}", "watermark markers, sent again at the next batch or tick"
        )
        log.debug("watermark marker not written; it is sent again", query_id=marker.query_id, error=str(error))

    def _forget_retired(self, topics: set[str]) -> None:
        """A graph that no longer receives markers is retired and its topic deleted: a producer that
        wrote there would log an error on every metadata refresh, so a fresh one takes its place."""
        with self._lock:
            retired = set(self._written) - topics
            for topic in retired:
                del self._written[topic]
        if retired:
            self.close()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=5)
            self._producer = None
