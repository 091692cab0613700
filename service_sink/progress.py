"""Progress reports: what each execution graph has processed and committed, kept in Redis.

The executor's loop polls each graph's Spark query (`lastProgress`) and records its batch id,
event-time watermark and input offsets. Spark updates that report before it writes the batch's
commit file, so a report only counts as committed once the graph's checkpoint has `commits/<batch>`;
then the committed batch and watermark are recorded. "Drained through W" is read from the
committed watermark, never from a query having stopped.

`committed_through` is the one answer to "how far has this graph emitted": the executor's drain,
recovery and retire read it here, in the process that computed it; the reports in Redis are for
`status` and for a restarted executor.

Polled, not listened for: a Python StreamingQueryListener runs on Spark's listener bus, which
drops events when a listener falls behind ("Dropping event from queue streams"), and a dropped
report could hold a drain for minutes (docs/architecture.md, "Known traps").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Protocol

import redis
import structlog
from pyspark.sql.streaming.listener import StreamingQueryProgress

from hotswap.contract.fence import Fence, fenced_write
from hotswap.contract.models import GraphProgress, now_ms
from hotswap.contract.names import Keys
from hotswap.contract.records import read_progress

log = structlog.get_logger(__name__)

IsCommitted = Callable[[str, int], bool]  # (query_id, batch_id) -> has the checkpoint committed it
CheckpointWatermark = Callable[[str], int | None]  # query_id -> watermark of its last committed batch
# (query_id, batch_id, Spark's watermark of the batch) -> how far the graph closed windows by that batch
BatchWatermark = Callable[[str, int, int | None], int | None]


def parse_spark_time(text: str | None) -> int | None:
    """Epoch ms of a timestamp as Spark writes it in progress reports ('2026-11-22T19:00:00.000Z')."""
    if not text:
        return None
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


class ReportsProgress(Protocol):
    """What the reporter reads of a graph's query (a Spark streaming query, or a closing graph's)."""

    @property
    def lastProgress(self) -> StreamingQueryProgress | None: ...


def input_offsets(progress: StreamingQueryProgress) -> dict[str, dict[str, int]]:
    """The end offsets of a batch's Kafka sources: topic -> partition -> offset."""
    offsets: dict[str, dict[str, int]] = {}
    for source in progress.sources:
        try:
            parsed = json.loads(source.endOffset) if source.endOffset else {}
        except (json.JSONDecodeError, TypeError):
            continue
        if isinstance(parsed, dict):
            for topic, parts in parsed.items():
                if isinstance(parts, dict):
                    offsets[str(topic)] = {str(p): int(o) for p, o in parts.items()}
    return offsets


class ProgressReporter:
    """Reports the progress of the execution graphs the executor runs."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        is_committed: IsCommitted,
        fence: Fence | None = None,
        checkpoint_watermark: CheckpointWatermark | None = None,
        batch_watermark: BatchWatermark | None = None,
    ):
        self._fence = fence  # reports are control state: only the lease holder writes them
        self._redis = client
        self._keys = keys
        self._is_committed = is_committed
        self._checkpoint_watermark = checkpoint_watermark
        # A closing graph keeps no Spark watermark: it says itself how far each batch closed.
        self._batch_watermark = batch_watermark
        self._latest: dict[str, GraphProgress] = {}
        self._floor: dict[str, int | None] = {}  # from the checkpoint, read once per graph

    def committed_through(self, query_id: str) -> int | None:
        """The watermark of the graph's last committed batch: every window ending at or before it
        has been emitted. After a restart it is never below what the graph's checkpoint says (a
        commit the reports had not confirmed before the restart still counts)."""
        report = self._latest.get(query_id) or self._stored(query_id)
        if query_id not in self._floor:
            self._floor[query_id] = self._checkpoint_watermark(query_id) if self._checkpoint_watermark else None
        reported = report.committed_watermark if report else None
        floor = self._floor[query_id]
        if reported is None or floor is None:
            return reported if floor is None else floor
        return max(reported, floor)

    def report(self, queries: Mapping[str, ReportsProgress]) -> None:
        """Record each graph's newest batch, then confirm the batches its checkpoint has committed."""
        for query_id, query in queries.items():
            progress = query.lastProgress
            if progress is not None:
                self._observe(query_id, progress)
        self._confirm_commits()

    def forget(self, query_id: str) -> None:
        self._latest.pop(query_id, None)
        self._floor.pop(query_id, None)

    def _observe(self, query_id: str, progress: StreamingQueryProgress) -> None:
        before = self._latest.get(query_id) or self._stored(query_id) or GraphProgress(query_id=query_id)
        batch_id = int(progress.batchId)
        if batch_id == before.batch_id:
            return  # nothing new since the last poll: no write
        event_time = progress.eventTime or {}
        watermark = parse_spark_time(event_time.get("watermark"))
        if self._batch_watermark is not None:
            watermark = self._batch_watermark(query_id, batch_id, watermark)
        report = before.changed(
            batch_id=batch_id,
            watermark=watermark,
            num_input_rows=int(progress.numInputRows),
            input_offsets=input_offsets(progress),
            updated_at=now_ms(),
        )
        self._latest[query_id] = report
        self._store(report)

    def _confirm_commits(self) -> None:
        for report in list(self._latest.values()):
            if report.batch_id > report.committed_batch and self._is_committed(report.query_id, report.batch_id):
                confirmed = report.changed(committed_batch=report.batch_id, committed_watermark=report.watermark)
                self._latest[report.query_id] = confirmed
                self._store(confirmed)

    def _store(self, report: GraphProgress) -> None:
        fenced_write(
            self._redis,
            self._fence,
            lambda pipe: pipe.set(self._keys.progress(report.query_id), report.model_dump_json()),
        )

    def _stored(self, query_id: str) -> GraphProgress | None:
        return read_progress(self._redis, self._keys, query_id)
