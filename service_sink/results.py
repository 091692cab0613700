"""Writing an execution graph's output to the user sink: the results topic, or a table
(service_sink.postgres, service_sink.delta).

Each row becomes a JSON object of all output columns (timestamps as epoch milliseconds) plus the
`query_id` of the version that produced it. The Kafka key is a compact JSON object of the window
start and every group column, in output order, e.g. `{"window_start":1700000010000,"key":"k2"}`:
timestamps as epoch milliseconds, other values as their JSON value and null as JSON null, so two
distinct groups never share a key (docs/architecture.md, "One key per result"). A batch that Spark replays
therefore overwrites its own results instead of adding to them. A sliding version's key also holds the
window end: its window starting at S is not the old version's window starting at S.

Each batch keeps only the windows its graph owns, by window end (contract.ownership): a graph that
received rows from before its cut (a sliding window ending after W starts before W) closes partial
windows at or before W, and they are not its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from hotswap.contract.batch_constants import HIGHEST, LOWEST, batch_long
from hotswap.contract.ownership import OwnedWindows
from hotswap.contract.settings import KafkaSettings

# to_json drops null fields by default; every column stays, and a null group in the key stays
# distinct from "" or "null".
_KEEP_NULLS = {"ignoreNullFields": "false"}


class ResultTable(Protocol):
    """A sink that is a table: it writes one batch's owned results itself, exactly once."""

    def write(self, results: DataFrame, query_id: str, group_columns: Sequence[str], batch_id: int) -> None: ...

    def close(self) -> None: ...


class ResultWriter:
    """The foreachBatch function of one execution graph."""

    def __init__(
        self,
        kafka: KafkaSettings,
        sink_topic: str,
        query_id: str,
        group_columns: tuple[str, ...],
        check_lease: Callable[[], None] | None = None,
        *,
        owned: Callable[[], OwnedWindows] | None = None,
        key_window_end: bool = False,
        unowned_topic: str | None = None,
        table: ResultTable | None = None,
    ) -> None:
        self._kafka = kafka
        self._sink_topic = sink_topic
        self._query_id = query_id
        self._group_columns = group_columns
        # Raises when this executor lost its lease: a stalled executor's graph must fail at its next
        # batch, before it writes a result, whether or not its control loop ever wakes up.
        self._check_lease = check_lease
        # The windows the graph owns, read once per batch (None: every window, as in tests of the writer).
        self._owned = owned
        self._key = ("window_start", "window_end") if key_window_end else ("window_start",)
        # A shadow's results topic: the windows it does not own go there instead of being dropped.
        self._unowned_topic = unowned_topic
        # The sink is a table: the owned results are written there, not to Kafka.
        self._table = table

    def emits_within(self, after: int | None, through: int) -> bool:
        """Whether a batch of the windows ending in (after, through] would write any result: a shadow
        writes every window, any other graph only those it owns (read now; contract.ownership says
        why that answer holds once a graph can close the window). A "no" checks the lease, as the
        write it stands for would: a stalled executor's graph fails at its next batch either way."""
        if self._owned is None or (self._unowned_topic is not None and self._table is None):
            return True
        if self._owned().overlaps(after, through):
            return True
        if self._check_lease is not None:
            self._check_lease()
        return False

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if self._check_lease is not None:
            self._check_lease()
        topic = F.lit(self._sink_topic)
        if self._owned is not None:
            owned = self._owned()
            if self._unowned_topic is not None and self._table is None:
                # A shadow: every result is written, its own windows to the sink, the rest to its topic.
                # (Where the sink is a table, a shadow left from before the namespace's sink changed
                # writes only its own windows, as any graph: a table holds each window once.)
                mine = _owned_condition(owned) if owned.ranges else F.lit(False)
                topic = F.when(mine, topic).otherwise(F.lit(self._unowned_topic))
            elif not owned.ranges:
                # Nothing to emit, but the batch must still run in full: Spark checks that every
                # state store of the query committed, and a filter that is plainly false would
                # let the optimiser skip the query's plan altogether.
                batch.write.format("noop").mode("overwrite").save()
                return
            else:
                batch = batch.where(_owned_condition(owned))
        if self._table is not None:
            self._table.write(batch, self._query_id, self._group_columns, batch_id)
            return
        types = {field.name: field.dataType for field in batch.schema.fields}
        value_columns = [_as_json_value(name, types[name]) for name in types]
        value_columns.append(F.lit(self._query_id).alias("query_id"))
        key_columns = [_as_json_value(name, types[name]) for name in (*self._key, *self._group_columns)]
        (
            batch.select(
                topic.alias("topic"),
                F.to_json(F.struct(*key_columns), _KEEP_NULLS).alias("key"),
                F.to_json(F.struct(*value_columns), _KEEP_NULLS).alias("value"),
            )
            .write.format("kafka")
            .options(**self._kafka.spark_kafka_sink_options())
            .mode("append")  # Kafka is written through DataSource V2, which needs it (spark_session.py)
            .save()
        )


def group_key(results: DataFrame, group_columns: Sequence[str]) -> Column:
    """The group columns' values as compact JSON in output order (`{"key":"k2"}`; `{}` without
    groups): with the version and the window, what identifies a result in a table sink."""
    if not group_columns:
        return F.lit("{}")
    types = {field.name: field.dataType for field in results.schema.fields}
    return F.to_json(F.struct(*(_as_json_value(c, types[c]) for c in group_columns)), _KEEP_NULLS)


def _owned_condition(owned: OwnedWindows) -> Column:
    """Rows whose window end (epoch ms) lies in one of the owned (after, through] ranges. The bounds
    are batch constants (contract.batch_constants), an open one as its widest value: a swap's cut
    turns the old graph's (after, None] into (after, W], and as literals the new bounds made Spark
    compile the job's last stage again in the old graph's drain (about 150 ms on an idle machine)."""
    end = "unix_millis(CAST(window_end AS TIMESTAMP))"
    condition = F.lit(False)
    for after, through in owned.ranges:
        low = LOWEST if after is None else after
        high = HIGHEST if through is None else through
        condition = condition | F.expr(f"{end} > {batch_long(low)} AND {end} <= {batch_long(high)}")
    return condition


def _as_json_value(name: str, data_type: T.DataType) -> Column:
    """The column as it appears in JSON: timestamps as epoch milliseconds, the rest unchanged."""
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
        return F.unix_millis(F.col(name).cast("timestamp")).alias(name)
    return F.col(name)
