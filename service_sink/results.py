"""Writing an execution graph's output to the user sink (the results topic).

Each row becomes a JSON object of all output columns (timestamps as epoch milliseconds) plus the
`query_id` of the version that produced it. The Kafka key is a compact JSON object of the window
start and every group column, in output order, e.g. `{"window_start":1700000010000,"key":"k2"}`:
timestamps as epoch milliseconds, other values as their JSON value and null as JSON null, so two
distinct groups never share a key (docs/architecture.md, "One key per result"). A batch that Spark replays
therefore overwrites its own results instead of adding to them.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from hotswap.contract.settings import Settings

# to_json drops null fields by default; every column stays, and a null group in the key stays
# distinct from "" or "null".
_KEEP_NULLS = {"ignoreNullFields": "false"}


class ResultWriter:
    """The foreachBatch function of one execution graph."""

    def __init__(self, settings: Settings, query_id: str, group_columns: tuple[str, ...]) -> None:
        self._settings = settings
        self._query_id = query_id
        self._group_columns = group_columns

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        types = {field.name: field.dataType for field in batch.schema.fields}
        value_columns = [_as_json_value(name, types[name]) for name in types]
        value_columns.append(F.lit(self._query_id).alias("query_id"))
        key_columns = [_as_json_value(name, types[name]) for name in ("window_start", *self._group_columns)]
        (
            batch.select(
                F.to_json(F.struct(*key_columns), _KEEP_NULLS).alias("key"),
                F.to_json(F.struct(*value_columns), _KEEP_NULLS).alias("value"),
            )
            .write.format("kafka")
            .options(**self._settings.spark_kafka_options())
            .option("topic", self._settings.sink_topic)
            .save()
        )


def _as_json_value(name: str, data_type: T.DataType) -> Column:
    """The column as it appears in JSON: timestamps as epoch milliseconds, the rest unchanged."""
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
        return F.unix_millis(F.col(name).cast("timestamp")).alias(name)
    return F.col(name)
