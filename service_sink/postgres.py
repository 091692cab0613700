"""Writing results into a Postgres table, exactly once (docs/sinks.md).

One table holds every version's results, one row per (version, window, group):

    query_id text, window_start timestamptz, window_end timestamptz, group_key text,
    <each output column of any version, nullable>,
    PRIMARY KEY (query_id, window_start, window_end, group_key)

`group_key` is the group columns' values as compact JSON in output order (`{"key":"k2"}`, `{}`
without groups), as the Kafka sink keys a result: versions group by different columns, and a
primary key can neither change its columns per version nor hold a null group value. The group
columns are also written as columns of their own, for the queries that read the table.

A swap that changes the result columns adds the new ones (`ADD COLUMN IF NOT EXISTS`): rows of a
version that lacks a column hold null in it. A column that exists with another type is refused,
naming both types, before anything is written.

Each batch is one transaction: its rows are upserted (`INSERT ... ON CONFLICT ... DO UPDATE`).
Spark replays a batch whose commit it never recorded; the replay computes the same results for the
same keys, so the table ends up with each row once, whether the crash came before the commit (the
transaction rolled back) or after it (the rows are overwritten with themselves). The service sink
reports a graph's progress only from batches Spark committed, so after this transaction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import structlog
from psycopg import sql
from pydantic import SecretStr
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from hotswap.contract.causes import SINK_OUTAGE
from hotswap.contract.faults import crash_point
from hotswap.contract.settings import PipelineSettings
from hotswap.contract.sink import SinkKind, SinkSpec
from hotswap.service_sink.errors import SinkSchemaConflict, SinkUnavailable, SinkWriteRefused
from hotswap.service_sink.results import group_key

log = structlog.get_logger(__name__)

KEY_COLUMNS = ("query_id", "window_start", "window_end", "group_key")
WINDOW_COLUMNS = ("window_start", "window_end")
CONNECT_TIMEOUT_S = 10
STATEMENT_TIMEOUT_MS = 60_000  # a write that takes longer fails its batch, which Spark replays
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# to_json drops null fields by default; a null group stays distinct from a missing one.
_KEEP_NULLS = {"ignoreNullFields": "false"}


def check_sink(pipeline: PipelineSettings) -> None:
    """Raises SinkUnavailable, in one line, if the namespace's sink is a Postgres database that
    cannot be reached (a Kafka sink is checked with the other topics)."""
    sink, url = pipeline.sink, pipeline.sink_url
    if sink.kind is not SinkKind.POSTGRES or url is None:
        return
    try:
        with psycopg.connect(url.get_secret_value(), connect_timeout=CONNECT_TIMEOUT_S) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as exc:
        raise SinkUnavailable(
            f"{sink}: its database cannot be reached ({_one_line(exc)}); check sink_url (HOTSWAP_SINK_URL, "
            "--sink-url) and that the server runs"
        ) from exc


def postgres_type(data_type: T.DataType) -> str:
    """The column type a Spark result column is stored as."""
    if isinstance(data_type, T.StringType | T.VarcharType | T.CharType):
        return "text"
    if isinstance(data_type, T.LongType | T.IntegerType | T.ShortType | T.ByteType):
        return "bigint"
    if isinstance(data_type, T.DoubleType | T.FloatType):
        return "double precision"
    if isinstance(data_type, T.DecimalType):
        return "numeric"
    if isinstance(data_type, T.BooleanType):
        return "boolean"
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
        return "timestamp with time zone"
    if isinstance(data_type, T.DateType):
        return "date"
    if isinstance(data_type, T.BinaryType):
        return "bytea"
    return "jsonb"  # arrays, maps, structs: as their JSON


class PostgresTable:
    """The sink table of one namespace, written by one execution graph (one connection, kept)."""

    def __init__(self, sink: SinkSpec, url: SecretStr) -> None:
        self._sink = sink
        schema, _, name = sink.target.rpartition(".")
        self._table = sql.Identifier(schema, name) if schema else sql.Identifier(name)
        self._url = url
        self._connection: psycopg.Connection[Any] | None = None
        self._columns: dict[str, str] | None = None  # the table's columns and their types, as last read

    def write(self, results: DataFrame, query_id: str, group_columns: Sequence[str], batch_id: int) -> None:
        """Upsert one batch's results, in one transaction (a replay upserts the same rows again)."""
        types = {f.name: f.dataType for f in results.schema.fields}
        for name in KEY_COLUMNS[:1] + KEY_COLUMNS[3:]:
            if name in types:
                raise SinkSchemaConflict(
                    f"query {query_id} returns a column {name!r}, which {self._sink} keeps for itself: rename it"
                )
        wanted = {name: postgres_type(t) for name, t in types.items() if name not in WINDOW_COLUMNS}
        rows = [_row(r, types) for r in _as_plain_values(results, group_columns).collect()]
        columns = list(wanted)
        try:
            connection = self._connect()
            with connection.transaction():
                self._ensure(connection, wanted, query_id)
                if rows:
                    self._upsert(connection, query_id, columns, rows)
        except psycopg.OperationalError as exc:
            self._drop_connection()
            raise SinkUnavailable(
                f"{SINK_OUTAGE}: {self._sink}: {_one_line(exc)}; the batch is replayed once it is back"
            ) from exc
        except psycopg.Error as exc:
            self._drop_connection()
            raise SinkWriteRefused(f"{self._sink} refused the batch's rows: {_one_line(exc)}") from exc
        if rows:  # committed, not yet in Spark's commit log: the batch is replayed, its rows upserted again
            crash_point("sink:after-commit")
            crash_point(f"sink:after-commit:{query_id}")
        log.debug("results written", sink=str(self._sink), query_id=query_id, rows=len(rows))

    def close(self) -> None:
        self._drop_connection()

    # -- the table -------------------------------------------------------------------------
    def _ensure(self, connection: psycopg.Connection[Any], wanted: Mapping[str, str], query_id: str) -> None:
        """Create the table, or add the columns this batch needs, unless they are there already."""
        if self._columns is not None and all(self._columns.get(c) == t for c, t in wanted.items()):
            return
        # Two graphs (the old and the new version) may both add columns: one at a time.
        connection.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (str(self._sink),))
        connection.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (query_id text NOT NULL, window_start timestamptz NOT NULL, "
                "window_end timestamptz NOT NULL, group_key text NOT NULL, "
                "PRIMARY KEY (query_id, window_start, window_end, group_key))"
            ).format(self._table)
        )
        found = self._read_columns(connection)
        for column, wanted_type in wanted.items():
            have = found.get(column)
            if have is None:
                connection.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} ").format(self._table, sql.Identifier(column))
                    + sql.SQL(wanted_type)
                )
                found[column] = wanted_type
            elif have != wanted_type:
                raise SinkSchemaConflict(
                    f"query {query_id} writes column {column!r} as {wanted_type}, but {self._sink} has it as "
                    f"{have}: rename the column in the query, or alter the table"
                )
        self._columns = found

    def _read_columns(self, connection: psycopg.Connection[Any]) -> dict[str, str]:
        schema, _, name = self._sink.target.rpartition(".")
        rows = connection.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_name = %s AND table_schema = COALESCE(NULLIF(%s, ''), current_schema())",
            (name, schema),
        ).fetchall()
        return {str(c): str(t) for c, t in rows}

    def _upsert(
        self, connection: psycopg.Connection[Any], query_id: str, columns: list[str], rows: list[tuple[Any, ...]]
    ) -> None:
        names = [*KEY_COLUMNS, *columns]
        update = (
            sql.SQL("DO UPDATE SET ")
            + sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in columns)
            if columns
            else sql.SQL("DO NOTHING")
        )
        statement = (
            sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) ").format(
                self._table,
                sql.SQL(", ").join(sql.Identifier(n) for n in names),
                sql.SQL(", ").join(sql.Placeholder() for _ in names),
                sql.SQL(", ").join(sql.Identifier(n) for n in KEY_COLUMNS),
            )
            + update
        )
        with connection.cursor() as cursor:
            cursor.executemany(statement, [(query_id, *row) for row in rows])

    # -- the connection --------------------------------------------------------------------
    def _connect(self) -> psycopg.Connection[Any]:
        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(
                self._url.get_secret_value(),
                connect_timeout=CONNECT_TIMEOUT_S,
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
                # statement_timeout is the server's: a connection that died silently is noticed by
                # the client's own keepalives and its unacknowledged-data timeout instead.
                keepalives=1,
                keepalives_idle=10,
                keepalives_interval=5,
                keepalives_count=3,
                tcp_user_timeout=STATEMENT_TIMEOUT_MS,
            )
            self._columns = None
        return self._connection

    def _drop_connection(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(psycopg.Error):  # already broken: nothing to close
                self._connection.close()
            self._connection = None
            self._columns = None


def _as_plain_values(results: DataFrame, group_columns: Sequence[str]) -> DataFrame:
    """The results with timestamps as epoch milliseconds (collect() would turn them into naive
    datetimes in the Python process's zone), nested values as JSON, and the group key first."""
    columns: list[Column] = []
    for field in results.schema.fields:
        kind = postgres_type(field.dataType)
        if kind == "timestamp with time zone":
            columns.append(F.unix_millis(F.col(field.name).cast("timestamp")).alias(field.name))
        elif kind == "jsonb":
            columns.append(F.to_json(F.col(field.name), _KEEP_NULLS).alias(field.name))
        else:
            columns.append(F.col(field.name))
    return results.select(group_key(results, group_columns).alias("_hotswap_group_key"), *columns)


def _row(row: Any, types: Mapping[str, T.DataType]) -> tuple[Any, ...]:
    """(window_start, window_end, group_key, each other column) as Postgres takes them."""
    values = row.asDict()
    key = values.pop("_hotswap_group_key")
    out: list[Any] = [_timestamp(values["window_start"]), _timestamp(values["window_end"]), key]
    for name, data_type in types.items():
        if name in WINDOW_COLUMNS:
            continue
        value = values[name]
        if isinstance(data_type, T.TimestampType | T.TimestampNTZType):
            value = _timestamp(value)
        elif isinstance(data_type, T.FloatType) and value is not None:
            value = float(value)
        elif isinstance(data_type, T.DecimalType) and value is not None:
            value = Decimal(value)
        out.append(value)
    return tuple(out)


def _timestamp(millis: int | None) -> datetime | None:
    return None if millis is None else _EPOCH + timedelta(milliseconds=int(millis))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
