"""Applying a user query to the `events` stream (execution_graph.source reads its file).

A query is either a `.sql` file over the view `events` (every top-level column of the schema its
version reads, plus `event_time`, `_kafka_key` and `_kafka_timestamp`; README, "Your own topic") or
a `.py` file that defines `query(events: DataFrame) -> DataFrame`, given the same DataFrame. Python
queries run as code with the executor's rights, only where the operator allows them (`query_kinds`);
SQL is the form to accept from untrusted submitters. Both are confined to their input
(execution_graph.confinement).
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Collection

import structlog
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame

from hotswap.contract.causes import first_line
from hotswap.contract.models import QueryKind, QuerySource
from hotswap.contract.reasons import ReasonCode
from hotswap.execution_graph.confinement import check_plan, check_text
from hotswap.execution_graph.errors import QueryRejected

EVENTS_VIEW = "events"
# Spark's error classes for a column or struct field a query names and its input lacks.
_MISSING_COLUMN = ("UNRESOLVED_COLUMN", "FIELD_NOT_FOUND")

# Temp views are per session; the lock keeps two graphs from binding `events` at the same time.
# The view is resolved when spark.sql() analyses the text, so replacing it later is harmless.
_view_lock = threading.Lock()

log = structlog.get_logger(__name__)


QueryFunction = Callable[[DataFrame], DataFrame]


def apply_query(events: DataFrame, source: QuerySource, tables: Collection[str] = ()) -> DataFrame:
    """The user's output DataFrame over `events`, confined (execution_graph.confinement) to `events`
    and the static `tables` of its session; raises QueryRejected with a one-line reason."""
    return prepare_query(source, tables)(events)


def prepare_query(source: QuerySource, tables: Collection[str] = ()) -> QueryFunction:
    """The user's query as a function of `events`, for a graph that applies it again to each batch
    of rows (a closing graph): a `.py` file's module is loaded once, here; its `query` function,
    or the SQL text's analysis, runs at each call. Each call raises QueryRejected with a one-line
    reason. The first call checks the SQL text before anything runs (`check_text`) and the plan for
    what it reads and calls (`check_plan`); later calls (a closing graph's batches) do not pay for
    it again: the same text makes the same plan, and a `.py` query is code the operator chose to
    trust."""
    if source.kind is QueryKind.SQL:
        apply: QueryFunction = lambda events: _apply_sql(events, source)  # noqa: E731
    else:
        function = _load_python(source)
        apply = lambda events: _call_python(function, events, source)  # noqa: E731
    checked = threading.Event()

    def confined(events: DataFrame) -> DataFrame:
        first = not checked.is_set()
        if first and source.kind is QueryKind.SQL:
            check_text(events.sparkSession, source)  # parsed only: nothing in it has run yet
        output = apply(events)
        if first:
            session = events.sparkSession
            check_plan(source, output, [events, *(session.table(name) for name in tables)])
            checked.set()
        return output

    return confined


def _apply_sql(events: DataFrame, source: QuerySource) -> DataFrame:
    # On `events`' own session, where its view is: a closing graph's batches come with the streaming
    # query's session, not the one the graph was started from. That session is the graph's own
    # (confinement.isolated_session), never the executor's.
    spark = events.sparkSession
    with _view_lock:
        events.createOrReplaceTempView(EVENTS_VIEW)
        try:
            return spark.sql(source.text.strip().rstrip(";"))
        except PySparkException as exc:
            missing = _missing_column(exc, events, source)
            raise QueryRejected(missing or f"query {source.name!r} does not analyse: {first_line(exc)}") from exc


def _load_python(source: QuerySource) -> Callable[[DataFrame], object]:
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
    return function  # type: ignore[no-any-return]  # the user's function: its result is checked at each call


def _call_python(function: Callable[[DataFrame], object], events: DataFrame, source: QuerySource) -> DataFrame:
    try:
        result = function(events)
    except PySparkException as exc:
        missing = _missing_column(exc, events, source)
        raise QueryRejected(
            missing or f"query {source.name!r} raised: {type(exc).__name__}: {first_line(exc)}"
        ) from exc
    except Exception as exc:  # the user's function may raise anything
        raise QueryRejected(
            f"query {source.name!r} raised: {type(exc).__name__}: {first_line(exc)}", ReasonCode.QUERY_RAISED
        ) from exc
    if not isinstance(result, DataFrame):
        raise QueryRejected(f"query {source.name!r} returned {type(result).__name__}, not a DataFrame")
    return result


def _missing_column(exc: PySparkException, events: DataFrame, source: QuerySource) -> str | None:
    """One line naming a column the query reads and the schema it was checked against lacks."""
    error_class = exc.getCondition() or ""
    if not error_class.startswith(_MISSING_COLUMN):
        return None
    parameters = exc.getMessageParameters() or {}
    name = parameters.get("objectName") or parameters.get("fieldName") or "?"
    schema = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in events.schema.fields)
    return f"query {source.name!r} reads {name}, which the schema it was checked against lacks: {schema}"
