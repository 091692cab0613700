"""Applying a user query to the `events` stream (execution_graph.source reads its file).

A query is either a `.sql` file over the view `events(key, value, ts, event_time)` or a `.py`
file that defines `query(events: DataFrame) -> DataFrame`. Python queries run as code with the
executor's rights; SQL is the form to accept from untrusted submitters.
"""

from __future__ import annotations

import threading
import types

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from hotswap.contract.models import QueryKind, QuerySource
from hotswap.contract.reasons import ReasonCode
from hotswap.execution_graph.errors import QueryRejected

EVENTS_VIEW = "events"
EVENTS_COLUMNS = ("key", "value", "ts", "event_time")

# Temp views are per session; the lock keeps two graphs from binding `events` at the same time.
# The view is resolved when spark.sql() analyses the text, so replacing it later is harmless.
_view_lock = threading.Lock()


def apply_query(spark: SparkSession, events: DataFrame, source: QuerySource) -> DataFrame:
    """The user's output DataFrame over `events`; raises QueryRejected with a one-line reason."""
    if source.kind is QueryKind.SQL:
        return _apply_sql(spark, events, source)
    return _apply_python(events, source)


def _apply_sql(spark: SparkSession, events: DataFrame, source: QuerySource) -> DataFrame:
    with _view_lock:
        events.createOrReplaceTempView(EVENTS_VIEW)
        try:
            return spark.sql(source.text.strip().rstrip(";"))
        except PySparkException as exc:
            raise QueryRejected(f"query {source.name!r} does not analyse: {first_line(exc)}") from exc


def _apply_python(events: DataFrame, source: QuerySource) -> DataFrame:
    module = types.ModuleType(f"hotswap_user_query_{source.name}")
    try:
        code = compile(source.text, source.path or f"<{source.name}>", "exec")
        exec(code, module.__dict__)  # noqa: S102 - .py queries are trusted code by contract (README)
    except SyntaxError as exc:
        raise QueryRejected(f"query {source.name!r} has a syntax error: {exc.msg} (line {exc.lineno})") from exc
    except Exception as exc:  # the user's module may raise anything at import
        raise QueryRejected(
            f"query {source.name!r} raised while loading: {type(exc).__name__}: {exc}", ReasonCode.QUERY_RAISED
        ) from exc
    function = module.__dict__.get("query")
    if not callable(function):
        raise QueryRejected(f"query {source.name!r} defines no function query(events) -> DataFrame")
    try:
        result = function(events)
    except Exception as exc:  # the user's function may raise anything
        raise QueryRejected(
            f"query {source.name!r} raised: {type(exc).__name__}: {first_line(exc)}", ReasonCode.QUERY_RAISED
        ) from exc
    if not isinstance(result, DataFrame):
        raise QueryRejected(f"query {source.name!r} returned {type(result).__name__}, not a DataFrame")
    return result


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
