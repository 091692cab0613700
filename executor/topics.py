"""Kafka topics the executor creates and removes: graph input topics, late and dead-letter."""

from __future__ import annotations

import time

import structlog
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError, UnknownTopicOrPartitionError

from contract.errors import TimeoutExpired
from contract.settings import Settings
from executor.errors import ExecutorError

log = structlog.get_logger(__name__)


class Topics:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._admin: KafkaAdminClient | None = None

    def _client(self) -> KafkaAdminClient:
        if self._admin is None:
            try:
                self._admin = KafkaAdminClient(**self._settings.kafka_python_config(), request_timeout_ms=15000)
            except KafkaError as exc:
                raise ExecutorError(
                    f"cannot reach Kafka at {self._settings.bootstrap}: {exc}; is the stack up (`hotswap stack up`)?"
                ) from exc
        return self._admin

    def partitions(self, topic: str) -> int | None:
        """Partition count of an existing topic, or None if it does not exist."""
        consumer = KafkaConsumer(**self._settings.kafka_python_config())
        try:
            parts = consumer.partitions_for_topic(topic)
        finally:
            consumer.close()
        return len(parts) if parts else None

    def ensure(self, topic: str, partitions: int, timeout_s: float = 30.0) -> None:
        """Create the topic if missing and wait until its metadata is visible."""
        try:
            self._client().create_topics(
                [NewTopic(topic, partitions, self._settings.topic_replication_factor)], timeout_ms=15000
            )
            log.info("topic created", topic=topic, partitions=partitions)
        except TopicAlreadyExistsError:
            pass
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.partitions(topic):
                return
            time.sleep(0.2)
        raise TimeoutExpired(f"topic {topic} was not visible in Kafka metadata after {timeout_s:.0f}s")

    def delete(self, topic: str) -> None:
        try:
            self._client().delete_topics([topic], timeout_ms=15000)
            log.info("topic deleted", topic=topic)
        except UnknownTopicOrPartitionError:
            pass

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
