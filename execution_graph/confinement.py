"""Confinement: a submitted query reads its `events` and the operator's static tables, and nothing else.

Whoever can submit a query can make the executor, which is the Spark driver holding every secret, run
it. So, before a query's text is analysed, and again over its analysed plan:

- SQL text is parsed, never run, and must be one query (a SELECT, a WITH, set operations over them):
  a command (SET, CREATE ..., ADD JAR, INSERT ...) is refused by its kind, `query_not_a_query`.
- It names no table by a qualified name (``text.`/etc/passwd` ``, `db.table`) and calls no table
  function that reads (`read_files`): `query_reads_outside`. The session also runs with
  `spark.sql.runSQLOnFiles=false` (executor/control/spark_session.py).
- It calls no reflection (`java_method`, `reflect`, `try_reflect`) and no function by a qualified name (`db.f`):
  `query_function_refused`.
- The analysed plan (of SQL and `.py` queries alike) reads only the leaves of `events` and of the
  static tables (`static_tables`), or rows it makes itself (VALUES, range): anything else,
  a catalog table or a file the query or its Python code read, is `query_reads_outside`.

The text is analysed only on a session of its own (`isolated_session`): a view, function or setting
it might leave behind never reaches the executor's session, nor another query's.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from hotswap.contract.causes import root_cause
from hotswap.contract.models import QueryKind, QuerySource
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import StaticTable
from hotswap.execution_graph.errors import QueryRejected
from hotswap.execution_graph.source import MAX_QUERY_BYTES

_CATALYST = "org.apache.spark.sql.catalyst"

# Parsed plans that do something instead of answering a query: every command (SET, CREATE ..., ADD
# JAR, CACHE, DROP, ...) and the inserts, which are not commands in Catalyst's class tree.
_STATEMENTS = (
    f"{_CATALYST}.plans.logical.Command",
    f"{_CATALYST}.plans.logical.InsertIntoDir",
    f"{_CATALYST}.plans.logical.InsertIntoStatement",
)
_LOGICAL_PLAN = f"{_CATALYST}.plans.logical.LogicalPlan"
_RELATION = f"{_CATALYST}.analysis.UnresolvedRelation"
_TABLE_FUNCTION = f"{_CATALYST}.analysis.UnresolvedTableValuedFunction"
_FUNCTION = f"{_CATALYST}.analysis.UnresolvedFunction"

# Functions that run arbitrary Java: System.getenv would put a secret in the results, System.exit
# would stop the driver.
REFUSED_FUNCTIONS = frozenset({"java_method", "reflect", "try_reflect"})
# Table functions that make rows from their arguments, reading nothing (Spark's generators, range).
_ROW_MAKING_TABLE_FUNCTIONS = frozenset(
    {"range", "explode", "explode_outer", "inline", "inline_outer", "posexplode", "posexplode_outer", "stack"}
)
# Leaves of an analysed plan that read nothing: literal rows and generated ranges.
# A reference to a CTE is a leaf too; its definition is walked where the WITH defines it.
_ROW_MAKING_LEAVES = frozenset({"LocalRelation", "OneRowRelation", "Range", "CTERelationRef"})
# Expressions of an analysed plan that call Java by name.
_REFLECTION = (f"{_CATALYST}.expressions.CallMethodViaReflection", f"{_CATALYST}.expressions.TryReflect")


def isolated_session(spark: SparkSession, tables: Mapping[str, StaticTable]) -> SparkSession:
    """A session of its own for one analysis or one graph: it shares the executor's SparkContext and
    configuration, not its views, functions or runtime settings. `tables` (`static_tables`) are its
    views, for lookups."""
    session = spark.newSession()
    for name, table in tables.items():
        session.read.format(table.format).load(table.path).createOrReplaceTempView(name)
    return session


def check_size(source: QuerySource) -> None:
    """Refuse a text over the size a query file may have: the submitting client refuses the file
    already, and this holds for text that reached the executor by another way."""
    size = len(source.text.encode("utf-8"))
    if size > MAX_QUERY_BYTES:
        raise QueryRejected(
            f"query {source.name!r} has {size:,} bytes; a query may have at most {MAX_QUERY_BYTES:,} (256 KiB)",
            ReasonCode.QUERY_TOO_LARGE,
        )


def check_kind(source: QuerySource, allowed: Collection[QueryKind]) -> None:
    """Refuse a query of a kind the operator does not allow (`query_kinds`)."""
    if source.kind not in allowed:
        kinds = ", ".join(sorted(str(kind) for kind in allowed))
        raise QueryRejected(
            f"query {source.name!r} is {source.kind} code, and this namespace takes only {kinds} queries; a .py query "
            "runs with the executor's rights, so the operator must allow it (query_kinds = sql,python)",
            ReasonCode.QUERY_KIND_REFUSED,
        )


def check_text(spark: SparkSession, source: QuerySource) -> None:
    """Refuse SQL text that is not one query, reads by a qualified name, or calls a refused
    function, from its parsed plan alone: parsing runs nothing, so a refused text leaves no trace."""
    text = source.text.strip().rstrip(";").strip()
    parser = spark._jsparkSession.sessionState().sqlParser()
    try:
        plan = parser.parsePlan(text)
    except (Py4JJavaError, PySparkException) as exc:
        if ";" in text and _parses(parser, text.split(";", 1)[0]):
            raise QueryRejected(
                f"query {source.name!r} holds several statements; submit one query (a SELECT or WITH)",
                ReasonCode.QUERY_NOT_A_QUERY,
            ) from exc
        raise QueryRejected(f"query {source.name!r} does not analyse: {root_cause(exc)}") from exc
    classes = _Classes(spark)
    statements = classes.present(*_STATEMENTS)
    relation, table_function, function = (classes.load(name) for name in (_RELATION, _TABLE_FUNCTION, _FUNCTION))
    for node in _nodes(plan, classes.load(_LOGICAL_PLAN)):
        if any(kind.isInstance(node) for kind in statements):
            raise QueryRejected(
                f"query {source.name!r} is a {node.nodeName()} statement, not a query; submit one query (a SELECT or "
                "WITH) over the view events",
                ReasonCode.QUERY_NOT_A_QUERY,
            )
        if relation.isInstance(node):
            parts = [str(part) for part in _seq(node.multipartIdentifier())]
            if len(parts) > 1:
                _reads_outside(source, ".".join(f"`{part}`" for part in parts))
        elif table_function.isInstance(node):
            name = _name(node.name())
            if name not in _ROW_MAKING_TABLE_FUNCTIONS:
                _reads_outside(source, f"the table function {name}()")
        elif function.isInstance(node):
            name = _name(node.nameParts())
            if name in REFUSED_FUNCTIONS or "." in name:
                _function_refused(source, name)


def check_plan(source: QuerySource, output: DataFrame, inputs: Collection[DataFrame]) -> None:
    """Refuse an analysed plan that reads anything but the leaves of `inputs` (`events` and the
    static tables) or calls Java by reflection, whatever built it (SQL text or Python code)."""
    classes = _Classes(output.sparkSession)
    logical = classes.load(_LOGICAL_PLAN)
    allowed = [leaf for frame in inputs for leaf in _leaves(frame._jdf.queryExecution().analyzed(), logical)]
    reflection = classes.present(*_REFLECTION)
    for node in _nodes(output._jdf.queryExecution().analyzed(), logical):
        if any(kind.isInstance(node) for kind in reflection):
            _function_refused(source, str(node.prettyName()))
        if logical.isInstance(node) and node.children().isEmpty():
            kind = str(node.nodeName())
            # sameResult: the same relation, whatever ids the analysis gave its columns this time.
            if kind in _ROW_MAKING_LEAVES or any(node.sameResult(leaf) for leaf in allowed):
                continue
            _reads_outside(source, _describe(node))


def _reads_outside(source: QuerySource, what: str) -> None:
    raise QueryRejected(
        f"query {source.name!r} reads {what}; a query reads only the view events and the static tables the operator "
        "lists (static_tables)",
        ReasonCode.QUERY_READS_OUTSIDE,
    )


def _function_refused(source: QuerySource, name: str) -> None:
    raise QueryRejected(
        f"query {source.name!r} calls {name}(), which a submitted query may not call (reflection and catalog "
        "functions are refused); use Spark's built-in functions",
        ReasonCode.QUERY_FUNCTION_REFUSED,
    )


def _nodes(root: Any, logical: Any) -> Iterator[Any]:
    """Every node under a Catalyst tree node: plans, their expressions, and the plans inside those
    (subqueries, CTE definitions: a node's inner children). `logical`: the LogicalPlan class."""
    pending = [root]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(_seq(node.children()))
        pending.extend(_seq(node.innerChildren()))
        if logical.isInstance(node):
            pending.extend(_seq(node.expressions()))


def _leaves(plan: Any, logical: Any) -> list[Any]:
    return [node for node in _nodes(plan, logical) if logical.isInstance(node) and node.children().isEmpty()]


def _describe(leaf: Any) -> str:
    """A leaf plan in a few words: the files it reads, or else the plan's own one-line text."""
    try:
        relation = leaf.relation()
        paths = [str(path) for path in _seq(relation.location().rootPaths())]
        text = f"the {relation.fileFormat().toString()} files {', '.join(paths)}"
    except (Py4JError, PySparkException):  # not a file relation
        text = " ".join(str(leaf.toString()).split())
    return text if len(text) <= 160 else text[:157] + "..."


def _seq(sequence: Any) -> list[Any]:
    return [sequence.apply(i) for i in range(sequence.size())]


def _name(parts: Any) -> str:
    """A function's name as written, lower-cased: a Scala Seq of its parts, or one string."""
    if isinstance(parts, str):
        return parts.lower()
    return ".".join(str(part) for part in _seq(parts)).lower()


def _parses(parser: Any, text: str) -> bool:
    try:
        parser.parsePlan(text)
    except (Py4JJavaError, PySparkException):
        return False
    return True


class _Classes:
    """Catalyst's classes by name, from the driver's class loader; a class this Spark version lacks is
    left out."""

    def __init__(self, spark: SparkSession) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._jvm = jvm
        self._loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()

    def load(self, name: str) -> Any:
        return self._jvm.java.lang.Class.forName(name, False, self._loader)

    def present(self, *names: str) -> list[Any]:
        """Those of `names` this Spark version has."""
        found = []
        for name in names:
            try:
                found.append(self.load(name))
            except (Py4JJavaError, PySparkException):
                continue
        return found
