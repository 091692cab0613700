"""Writing an execution graph's output to the user sink (the results topic).

Each row becomes a JSON object of all output columns (timestamps as epoch milliseconds) plus the
`query_id` of the version that produced it. The Kafka key is the window start plus the group
columns, so a batch that Spark replays overwrites its own results instead of adding to them.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from contract.settings import Settings


class ResultWriter:
    """The foreachBatch function of one execution graph."""

    def __init__(self, settings: Settings, query_id: str, group_columns: tuple[str, ...]) -> None:
        self._settings = settings
        self._query_id = query_id
        self._group_columns = group_columns

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        value_columns: list[Column] = []
        for field in batch.schema.fields:
            if isinstance(field.dataType, T.TimestampType | T.TimestampNTZType):
                value_columns.append(F.unix_millis(F.col(field.name).cast("timestamp")).alias(field.name))
            else:
                value_columns.append(F.col(field.name))
        value_columns.append(F.lit(self._query_id).alias("query_id"))
        key_parts = [F.unix_millis(F.col("window_start")).cast("string")]
        key_parts += [F.coalesce(F.col(c).cast("string"), F.lit("")) for c in self._group_columns]
        (
            batch.select(
                F.concat_ws("|", *key_parts).alias("key"),
                F.to_json(F.struct(*value_columns)).alias("value"),
            )
            .write.format("kafka")
            .options(**self._settings.spark_kafka_options())
            .option("topic", self._settings.sink_topic)
            .save()
        )
