"""Reading every result back from the namespace's sink, whichever it is, as `audit.Result`s: what the
demo shows and checks. A table's rows are read the way a user of the table reads them: Postgres with
a SELECT, Delta Lake with a plain Spark batch query."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from hotswap.contract.settings import KafkaSettings, PipelineSettings
from hotswap.contract.sink import SinkKind
from hotswap.service_sink.audit import Result, read_results
from hotswap.service_sink.errors import SinkUnavailable


class SinkReader:
    def __init__(self, pipeline: PipelineSettings, kafka: KafkaSettings, spark: SparkSession | None = None) -> None:
        self._sink = pipeline.sink
        self._url = pipeline.sink_url
        self._kafka = kafka
        self._spark = spark  # reads a Delta table

    @property
    def describe(self) -> str:
        """How a user reads the results back, in one line."""
        if self._sink.kind is SinkKind.DELTA:
            return f'spark.read.format("delta").load("{self._sink.target}")'
        if self._sink.kind is SinkKind.POSTGRES:
            return f"SELECT * FROM {self._sink.target}"
        return f"the topic {self._sink.target}, keyed by (window, group)"

    def results(self, timeout_s: float = 10.0) -> list[Result]:
        if self._sink.kind is SinkKind.DELTA:
            return self._delta()
        if self._sink.kind is SinkKind.POSTGRES:
            return self._postgres()
        return read_results(self._kafka, self._sink.target, timeout_s)

    def _delta(self) -> list[Result]:
        if self._spark is None:
            raise SinkUnavailable(f"{self._sink} is read with Spark, and this reader has no session")
        try:
            frame = self._spark.read.format("delta").load(self._sink.target)
        except Exception:  # noqa: BLE001 - no table yet (no batch wrote one): no results
            return []
        rows = frame.select(
            "*",
            F.unix_millis("window_start").alias("_start_ms"),
            F.unix_millis("window_end").alias("_end_ms"),
        ).collect()
        return [_result(r.asDict()) for r in rows]

    def _postgres(self) -> list[Result]:
        assert self._url is not None  # settings refuse a postgres sink without one
        try:
            with (
                psycopg.connect(self._url.get_secret_value(), connect_timeout=10) as connection,
                connection.cursor(row_factory=dict_row) as cursor,
            ):
                # Quoted as the writer quotes it: a table may be named `user` or `order`.
                table = sql.Identifier(*self._sink.target.split("."))
                exists = cursor.execute("SELECT to_regclass(%s)", (table.as_string(connection),)).fetchone()
                if exists is None or next(iter(exists.values())) is None:
                    return []
                rows = cursor.execute(sql.SQL("SELECT * FROM {}").format(table)).fetchall()
        except psycopg.Error as exc:
            raise SinkUnavailable(f"{self._sink} cannot be read: {str(exc).strip().splitlines()[0]}") from exc
        out = []
        for row in rows:
            values = dict(row)
            values["_start_ms"] = _millis(values["window_start"])
            values["_end_ms"] = _millis(values["window_end"])
            out.append(_result(values))
        return out


def _millis(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def _result(values: dict[str, Any]) -> Result:
    """A table's row as a result: its window in epoch ms, keyed by its identity (version, window, group)."""
    start, end = int(values.pop("_start_ms")), int(values.pop("_end_ms"))
    group_key = values.pop("group_key", None)
    query_id = str(values.get("query_id"))
    row = {k: v for k, v in values.items() if v is not None and k not in ("window_start", "window_end")}
    row.update(window_start=start, window_end=end)
    key = json.dumps([query_id, start, end, group_key])
    return Result(key=key, query_id=query_id, window_start=start, window_end=end, row=row)
