"""The service graph's own Kafka clients, outside Spark: Kafka's view of the source topic, and the
producer of watermark markers."""

from __future__ import annotations

import structlog
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from hotswap.contract.envelope import ROUTE_HEADER, marker_route
from hotswap.contract.settings import Settings
from hotswap.contract.windows import marker_event_time
from hotswap.service_graph.routing import Marker

log = structlog.get_logger(__name__)

MARKER_KEY = b"__hotswap_marker__"


class SourceOffsets:
    """Kafka's view of the source topic: what is waiting (end offsets) and what is left (log start)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._consumer: KafkaConsumer | None = None

    def _parts(self) -> tuple[KafkaConsumer, list[TopicPartition]]:
        if self._consumer is None:
            self._consumer = KafkaConsumer(**self._settings.kafka_python_config(), enable_auto_commit=False)
        topic = self._settings.source_topic
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

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


class MarkerWriter:
    """Writes watermark markers into execution graphs' topics, each at most once per watermark."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._producer: KafkaProducer | None = None
        self._written: dict[str, int] = {}  # topic -> watermark of the last marker written there

    def write(self, markers: list[Marker]) -> None:
        """Write the markers of one batch or tick: `markers` names every graph that still receives them."""
        self._forget_retired({m.topic for m in markers})
        markers = [m for m in markers if self._written.get(m.topic) != m.watermark]
        if not markers:
            return
        if self._producer is None:
            self._producer = KafkaProducer(**self._settings.kafka_python_config(), acks="all")
        for marker in markers:
            headers = [(ROUTE_HEADER, marker_route(marker_event_time(marker.watermark)))]
            # Every partition gets the marker: each must see the watermark move.
            for partition in sorted(self._producer.partitions_for(marker.topic) or {0}):
                self._producer.send(marker.topic, key=MARKER_KEY, value=b"", headers=headers, partition=partition)
        self._producer.flush(timeout=30)
        for marker in markers:
            self._written[marker.topic] = marker.watermark
        log.debug("watermark markers written", markers=[(m.query_id, m.watermark) for m in markers])

    def _forget_retired(self, topics: set[str]) -> None:
        """A graph that no longer receives markers is retired and its topic deleted: a producer that
        wrote there would log an error on every metadata refresh, so a fresh one takes its place."""
        retired = set(self._written) - topics
        if retired:
            for topic in retired:
                del self._written[topic]
            self.close()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=5)
            self._producer = None
