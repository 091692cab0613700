"""Progress reports: what each execution graph has processed and committed, kept in Redis.

A StreamingQueryListener records each batch's id, event-time watermark and input offsets as
Spark reports them. Spark posts that event before it writes the batch's commit file, so a
report only counts as committed once `commits/<batch>` exists in the graph's checkpoint;
`confirm_commits` checks that and records the committed batch and watermark. "Drained through
W" is read from the committed watermark, never from a query having stopped.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import redis
import structlog
from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener

from contract.errors import ControlStateLost, LeaseLost
from contract.fence import Fence, fenced_write
from contract.models import GraphProgress, now_ms
from contract.names import Keys
from contract.records import read_progress

log = structlog.get_logger(__name__)

CheckpointFor = Callable[[str], str]


def parse_spark_time(text: str | None) -> int | None:
    """Epoch ms of a timestamp as Spark writes it in progress reports ('2026-11-22T19:00:00.000Z')."""
    if not text:
        return None
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


class ProgressReporter(StreamingQueryListener):
    """Reports the progress of the execution graphs whose query names start with `prefix`."""

    def __init__(
        self,
        spark: SparkSession,
        client: redis.Redis,
        keys: Keys,
        prefix: str,
        checkpoint_for: CheckpointFor,
        fence: Fence | None = None,
    ):
        self._spark = spark
        self._fence = fence  # reports are control state: only the lease holder writes them
        self._redis = client
        self._keys = keys
        self._prefix = prefix
        self._checkpoint_for = checkpoint_for
        self._lock = threading.Lock()
        self._latest: dict[str, GraphProgress] = {}

    # -- listener callbacks (Spark's listener thread) --------------------------------------
    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        name = progress.name or ""
        if not name.startswith(self._prefix):
            return
        query_id = name[len(self._prefix) :]
        offsets: dict[str, dict[str, int]] = {}
        for source in progress.sources:
            try:
                parsed = json.loads(source.endOffset) if source.endOffset else {}
            except json.JSONDecodeError:
                continue
            if isinstance(parsed, dict):
                for topic, parts in parsed.items():
                    if isinstance(parts, dict):
                        offsets[str(topic)] = {str(p): int(o) for p, o in parts.items()}
        watermark = parse_spark_time(progress.eventTime.get("watermark")) if progress.eventTime else None
        with self._lock:
            before = self._latest.get(query_id) or self._stored(query_id) or GraphProgress(query_id=query_id)
            report = before.changed(
                batch_id=int(progress.batchId),
                watermark=watermark,
                num_input_rows=int(progress.numInputRows),
                input_offsets=offsets,
                updated_at=now_ms(),
            )
            self._latest[query_id] = report
            try:
                self._store(report)
            except (LeaseLost, ControlStateLost) as exc:
                # The executor's loop sees the same and stops; Spark's listener thread only skips the report.
                log.debug("progress not reported", query_id=query_id, reason=str(exc))

    # -- commit confirmation (executor's loop) ---------------------------------------------
    def confirm_commits(self) -> None:
        with self._lock:
            pending = [p for p in self._latest.values() if p.batch_id > p.committed_batch]
        for report in pending:
            if not self._is_committed(report.query_id, report.batch_id):
                continue
            with self._lock:
                # A newer batch may have been reported meanwhile; it stays pending until its own commit.
                latest = self._latest.get(report.query_id, report)
                confirmed = latest.changed(committed_batch=report.batch_id, committed_watermark=report.watermark)
                self._latest[report.query_id] = confirmed
                self._store(confirmed)

    def _store(self, report: GraphProgress) -> None:
        fenced_write(
            self._redis,
            self._fence,
            lambda pipe: pipe.set(self._keys.progress(report.query_id), report.model_dump_json()),
        )

    def forget(self, query_id: str) -> None:
        with self._lock:
            self._latest.pop(query_id, None)

    def _stored(self, query_id: str) -> GraphProgress | None:
        return read_progress(self._redis, self._keys, query_id)

    def _is_committed(self, query_id: str, batch_id: int) -> bool:
        jvm = self._spark.sparkContext._jvm
        assert jvm is not None
        path = jvm.org.apache.hadoop.fs.Path(f"{self._checkpoint_for(query_id)}/commits/{batch_id}")
        fs = path.getFileSystem(self._spark.sparkContext._jsc.hadoopConfiguration())
        return bool(fs.exists(path))
