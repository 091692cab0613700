"""Writing results into a Delta Lake table, exactly once (docs/sinks.md).

Every version appends its results to one table, with a `query_id` column and a `group_key` (the
group columns' values as JSON, as in the Postgres table: with the version and the window, what
identifies a result whatever each version groups by); a version that returns
new columns adds them (`mergeSchema`), and rows of versions without them read null there.

Each batch is appended under Delta's idempotent-write options: `txnAppId` names the writing graph
(its Spark query id, new for every graph ever recorded), and `txnVersion` is the batch id. Delta
records the pair in the same commit as the rows and skips a write whose version it has already
committed for that id. So a batch Spark replays after a crash (committed to Delta, not yet in
Spark's commit log) writes nothing the second time, and the table holds each (version, window,
group) once. The service sink reports progress only from batches Spark committed, so after this
commit. Why this and not a MERGE on (query, window, group): docs/architecture.md, "Sinks".
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from hotswap.contract.causes import SINK_OUTAGE, root_cause
from hotswap.contract.faults import crash_point
from hotswap.contract.sink import SinkSpec
from hotswap.service_sink.errors import SinkSchemaConflict, SinkUnavailable
from hotswap.service_sink.results import group_key

log = structlog.get_logger(__name__)

# Delta's error classes and exceptions for another writer's commit that got in first.
CONCURRENT_COMMITS = ("DELTA_METADATA_CHANGED", "DELTA_CONCURRENT", "ConcurrentAppend", "MetadataChanged")
CONCURRENT_ATTEMPTS = 3
SCHEMA_CONFLICTS = ("DELTA_FAILED_TO_MERGE_FIELDS", "DELTA_MERGE_INCOMPATIBLE_DATATYPE")


class DeltaTable:
    """The sink table of one namespace, as one execution graph writes it."""

    def __init__(self, sink: SinkSpec, writer_id: str) -> None:
        self._sink = sink
        # The graph's Spark query id: unique to this graph, so no other graph's batch ids (nor this
        # namespace's earlier life, after a reset) can make Delta skip one of its writes.
        self._writer_id = f"hotswap-{writer_id}"

    def write(self, results: DataFrame, query_id: str, group_columns: Sequence[str], batch_id: int) -> None:
        """Append one batch's results, once for this graph and batch id."""
        for name in ("query_id", "group_key"):
            if name in results.columns:
                raise SinkSchemaConflict(
                    f"query {query_id} returns a column {name!r}, which {self._sink} keeps for itself: rename it"
                )
        # Most batches of a stateful graph close no window: an empty batch writes no commit, which
        # costs a Delta table about a second on two cores. Counted, not isEmpty(): every partition
        # must run (and is cached for the write), or a replay that Delta skips would leave a stateful
        # query's state stores uncommitted, which Spark refuses.
        results = results.persist()
        try:
            if results.count() == 0:
                return
            self._append(results.withColumn("group_key", group_key(results, group_columns)), query_id, batch_id)
        finally:
            results.unpersist()
        # Committed to Delta, not yet in Spark's commit log: the batch is replayed, and skipped.
        crash_point("sink:after-commit")
        crash_point(f"sink:after-commit:{query_id}")
        log.debug("results written", sink=str(self._sink), query_id=query_id, batch_id=batch_id)

    def _append(self, results: DataFrame, query_id: str, batch_id: int) -> None:
        """Append, trying again when another writer's commit got in first: during a swap the old and
        the new version commit to the table at once, and the new one may add columns. Trying again
        cannot write twice (the transaction id), and a conflict is decided within one commit."""
        for attempt in range(1, CONCURRENT_ATTEMPTS + 1):
            try:
                (
                    results.withColumn("query_id", F.lit(query_id))
                    .write.format("delta")
                    .mode("append")
                    .option("mergeSchema", "true")
                    .option("txnAppId", self._writer_id)
                    .option("txnVersion", str(batch_id))
                    .save(self._sink.target)
                )
                return
            except (PySparkException, Py4JJavaError) as exc:
                text = root_cause(exc)
                if any(mark in text for mark in SCHEMA_CONFLICTS):
                    raise SinkSchemaConflict(
                        f"query {query_id} returns a column with another type than {self._sink} has ({text}): "
                        "rename the column in the query"
                    ) from exc
                if any(mark in text for mark in CONCURRENT_COMMITS) and attempt < CONCURRENT_ATTEMPTS:
                    log.info("concurrent commit to the table; appending again", sink=str(self._sink), error=text)
                    continue
                raise SinkUnavailable(f"{SINK_OUTAGE}: {self._sink}: {text}") from exc

    def close(self) -> None:
        """Nothing is held between batches (Spark writes the table)."""
