"""Writing an execution graph's output to the user sink (the results topic).

Each row becomes a JSON object of all output columns (timestamps as epoch milliseconds) plus the
`query_id` of the version that produced it. The Kafka key is a compact JSON object of the window
start and every group column, in output order, e.g. `{"window_start":1700000010000,"key":"k2"}`:
timestamps as epoch milliseconds, other values as their JSON value and null as JSON null, so two
distinct groups never share a key (docs/architecture.md, "One key per result"). A batch that Spark replays
therefore overwrites its own results instead of adding to them.
"""

from __future__ import annotations

import uuid

import redis
import structlog
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings

log = structlog.get_logger(__name__)

# to_json drops null fields by default; every column stays, and a null group in the key stays
# distinct from "" or "null".
_KEEP_NULLS = {"ignoreNullFields": "false"}


# Adds a batch's result rows to `results:<query_id>` in the counters hash, once per batch id: a
# batch that Spark replays (same id) was counted when it first wrote its rows.
_COUNT_ONCE = """
local last = tonumber(redis.call('hget', KEYS[2], ARGV[1]) or '-1')
if tonumber(ARGV[2]) <= last then
  return 0
end
redis.call('hset', KEYS[2], ARGV[1], ARGV[2])
redis.call('hincrby', KEYS[1], 'results:' .. ARGV[1], ARGV[3])
return 1
"""


class ResultCounter:
    """Counts the result rows each graph wrote, per batch id, in the namespace's counters hash.

    Counted where they are written, after the write: a batch that fails or is cancelled counts
    nothing, and its replay counts once. It is a statistic for `status --watch`, the dashboard and
    the metrics (results per second), not a control decision, so it needs no lease; if Redis does
    not answer, the count is skipped and the results still flow.
    """

    def __init__(self, settings: Settings, query_id: str) -> None:
        self._settings = settings
        self._query_id = query_id
        self._keys = Keys(settings.namespace)
        self._redis: redis.Redis | None = None

    def record(self, batch_id: int, rows: int) -> None:
        try:
            if self._redis is None:
                self._redis = redis.Redis.from_url(self._settings.redis_dsn, socket_timeout=5)
            self._redis.eval(
                _COUNT_ONCE, 2, self._keys.counters, self._keys.result_batches, self._query_id, batch_id, rows
            )
        except redis.RedisError as exc:
            log.warning("result rows not counted", query_id=self._query_id, batch=batch_id, error=str(exc))


class ResultWriter:
    """The foreachBatch function of one execution graph."""

    def __init__(self, settings: Settings, query_id: str, group_columns: tuple[str, ...]) -> None:
        self._settings = settings
        self._query_id = query_id
        self._group_columns = group_columns
        self._counter = ResultCounter(settings, query_id)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        types = {field.name: field.dataType for field in batch.schema.fields}
        value_columns = [_as_json_value(name, types[name]) for name in types]
        value_columns.append(F.lit(self._query_id).alias("query_id"))
        key_columns = [_as_json_value(name, types[name]) for name in ("window_start", *self._group_columns)]
        # The rows are counted by the write itself (an observed metric), not by a second job.
        written = Observation(f"results-{uuid.uuid4().hex}")
        (
            batch.observe(written, F.count(F.lit(1)).alias("rows"))
            .select(
                F.to_json(F.struct(*key_columns), _KEEP_NULLS).alias("key"),
                F.to_json(F.struct(*value_columns), _KEEP_NULLS).alias("value"),
            )
            .write.format("kafka")
            .options(**self._settings.spark_kafka_options())
            .option("topic", self._settings.sink_topic)
            .save()
        )
        self._counter.record(batch_id, int(written.get.get("rows", 0)))


def _as_json_value(name: str, data_type: T.DataType) -> Column:
    """The column as it appears in JSON: timestamps as epoch milliseconds, the rest unchanged."""
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
        return F.unix_millis(F.col(name).cast("timestamp")).alias(name)
    return F.col(name)
