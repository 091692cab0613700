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
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from hotswap.contract.faults import crash_point
from hotswap.contract.sink import SinkSpec
from hotswap.service_sink.errors import SinkSchemaConflict, SinkUnavailable
from hotswap.service_sink.results import group_key

log = structlog.get_logger(__name__)


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
        # Most batches of a stateful graph close no window: computed once (cached), an empty batch
        # writes no commit, which costs a Delta table about a second on two cores.
        results = results.persist()
        try:
            if results.isEmpty():
                return
            self._append(results.withColumn("group_key", group_key(results, group_columns)), query_id, batch_id)
        finally:
            results.unpersist()
        # Committed to Delta, not yet in Spark's commit log: the batch is replayed, and skipped.
        crash_point("sink:after-commit")
        crash_point(f"sink:after-commit:{query_id}")
        log.debug("results written", sink=str(self._sink), query_id=query_id, batch_id=batch_id)

    def _append(self, results: DataFrame, query_id: str, batch_id: int) -> None:
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
        except PySparkException as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if "DELTA_FAILED_TO_MERGE_FIELDS" in text or "DELTA_MERGE_INCOMPATIBLE_DATATYPE" in text:
                raise SinkSchemaConflict(
                    f"query {query_id} returns a column with another type than {self._sink} has ({text}): rename "
                    "the column in the query"
                ) from exc
            raise SinkUnavailable(f"{self._sink} refused the write: {text}") from exc

    def close(self) -> None:
        """Nothing is held between batches (Spark writes the table)."""
