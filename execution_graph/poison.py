"""A poison batch: one the serving query failed on for good. With `poison_batches = dead_letter`
its rows are moved to the dead-letter topic, and the graph, restarted, skips them
(GraphRecord.skipped; events.not_skipped).

A row is copied with its key and value, its route header, and the dead-letter headers the service
graph writes (contract/envelope.py), plus the query that failed. Copied first, recorded skipped
after: a crash in between copies the rows again, so a row may be in the dead-letter topic twice
(the same `hotswap.source`), never lost.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from hotswap.contract.envelope import (
    QUERY_HEADER,
    REASON_CODE_HEADER,
    REASON_HEADER,
    ROUTE_HEADER,
    SOURCE_HEADER,
    DeadLetterReason,
    RowKind,
    parse_route,
)
from hotswap.contract.errors import TimeoutExpired
from hotswap.contract.models import GraphRecord, SkippedRows
from hotswap.contract.settings import KafkaSettings


def dead_letter_rows(
    kafka: KafkaSettings,
    dead_letter_topic: str,
    record: GraphRecord,
    rows: Sequence[SkippedRows],
    why: str,
    timeout_s: float,
) -> int:
    """Copy the data rows of `rows` from the graph's topic to the dead-letter topic; returns how many."""
    deadline = time.monotonic() + timeout_s
    consumer = KafkaConsumer(**kafka.kafka_python_config(), enable_auto_commit=False)
    producer = KafkaProducer(**kafka.kafka_python_config(), acks="all")
    moved = 0
    try:
        for skipped in rows:
            part = TopicPartition(record.topic, skipped.partition)
            consumer.assign([part])
            consumer.seek(part, skipped.start)
            while consumer.position(part) < skipped.end:
                if time.monotonic() > deadline:
                    raise TimeoutExpired(
                        f"moving poison batch {skipped.batch_id} of {record.query_id} to the dead-letter topic took "
                        f"over {timeout_s:.0f}s"
                    )
                for message in consumer.poll(timeout_ms=1000).get(part, []):
                    if message.offset >= skipped.end:
                        break
                    headers = dict(message.headers or [])
                    route = headers.get(ROUTE_HEADER)
                    if route is None:
                        continue
                    kind, partition, offset, event_time, _ = parse_route(route)
                    if kind != RowKind.DATA or not skipped.holds(message.partition, message.offset, event_time):
                        continue
                    producer.send(
                        dead_letter_topic,
                        key=message.key,
                        value=message.value,
                        headers=[
                            (ROUTE_HEADER, route),
                            (REASON_HEADER, why.encode()),
                            (REASON_CODE_HEADER, DeadLetterReason.POISON_BATCH.value.encode()),
                            (SOURCE_HEADER, f"{partition}/{offset}".encode()),
                            (QUERY_HEADER, record.query_id.encode()),
                        ],
                    )
                    moved += 1
        producer.flush(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        consumer.close()
        producer.close(timeout=5)
    return moved
