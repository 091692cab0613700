"""Reading a query's analysed logical plan through py4j: where its windows are defined and where
each output column's values come from. Validation (validation.py) asks; this module knows Catalyst."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

# Metadata Spark's analyser puts on the attribute that window() / session_window() defines
# (TimeWindow.marker and SessionWindow.marker in Catalyst).
TIME_WINDOW_MARKER = "spark.timeWindow"
SESSION_WINDOW_MARKER = "spark.sessionWindow"

_CATALYST = "org.apache.spark.sql.catalyst"
_PROJECT = f"{_CATALYST}.plans.logical.Project"
_EXPAND = f"{_CATALYST}.plans.logical.Expand"
_AGGREGATE = f"{_CATALYST}.plans.logical.Aggregate"
_ALIAS = f"{_CATALYST}.expressions.Alias"
_ATTRIBUTE = f"{_CATALYST}.expressions.Attribute"
_TIMESTAMP_CONVERSION = f"{_CATALYST}.expressions.PreciseTimestampConversion"
_AGGREGATE_EXPRESSION = f"{_CATALYST}.expressions.aggregate.AggregateExpression"
_AGGREGATE_FUNCTION = f"{_CATALYST}.expressions.aggregate.AggregateFunction"

# A py4j handle on a JVM object (plan node, expression, attribute); py4j gives it no static type.
JavaObject = Any


class Origin(enum.Enum):
    """Where the values of an output column come from."""

    WINDOW = "window"  # the window struct, or only grouping expressions over it
    GROUP = "group"  # grouping expressions of the query's Aggregate
    AGGREGATE = "aggregate"  # an aggregate function
    UNKNOWN = "unknown"  # the plan does not say: a source column, or a node we do not trace through


@dataclass(frozen=True)
class WindowGrid:
    """What one window() of a query does to an event: the (start, end) µs of the windows it puts it
    in (all of them, before Spark's filter drops those that do not hold it), and the µs between
    two window starts."""

    windows: list[tuple[int, int]]
    slide_micros: int


class Plan:
    """Reading an analysed logical plan through py4j: window definitions and column lineage."""

    def __init__(self, jvm: JavaObject, root: JavaObject) -> None:
        self._jvm = jvm
        self._root = root
        self._classes: dict[str, JavaObject] = {}
        self._members: dict[str, JavaObject] = {}

    # -- the window ------------------------------------------------------------------------------
    def has_aggregate(self) -> bool:
        return any(self._is(node, _AGGREGATE) for node in self._nodes())

    def has_session_window(self) -> bool:
        return any(_has_marker(a, SESSION_WINDOW_MARKER) for node in self._nodes() for a in _seq(node.output()))

    def window_grids(self, probe_micros: int) -> list[WindowGrid]:
        """For each window() in the plan, the windows it assigns to an event at `probe_micros`, and
        its slide.

        A tumbling window() becomes one struct expression, a sliding one ceil(size / slide) of them,
        the i-th starting i slides before the latest window start at or before the event. Their
        values at the probe give the size and the latest start s; the latest start for an event
        1 µs before s is one slide earlier, whatever the kind."""
        out = []
        for definitions in self._window_definitions():
            windows = self._windows_at(definitions, probe_micros)
            if not windows:
                continue
            latest = max(start for start, _ in windows)
            before = self._windows_at(definitions, latest - 1)
            slide = latest - max(start for start, _ in before) if before else 0
            out.append(WindowGrid(windows=windows, slide_micros=slide))
        return out

    def _windows_at(self, definitions: list[JavaObject], probe_micros: int) -> list[tuple[int, int]]:
        evaluated = (self._evaluate_window(struct, probe_micros) for struct in definitions)
        return sorted({w for w in evaluated if w is not None})

    def _window_definitions(self) -> list[list[JavaObject]]:
        """The window struct expressions the analyser put in place of each window() call: one for
        a tumbling window (a Project), one per overlapping window for a sliding one (an Expand)."""
        found: list[list[JavaObject]] = []
        for node in self._nodes():
            if self._is(node, _PROJECT):
                for named in _seq(node.projectList()):
                    if self._is(named, _ALIAS) and _has_marker(named, TIME_WINDOW_MARKER):
                        found.append([named.child()])
            elif self._is(node, _EXPAND):
                projections = _seq(node.projections())
                for i, attribute in enumerate(_seq(node.output())):
                    if _has_marker(attribute, TIME_WINDOW_MARKER):
                        found.append([_seq(projection)[i] for projection in projections])
        return found

    def _evaluate_window(self, struct: JavaObject, probe_micros: int) -> tuple[int, int] | None:
        """The window struct for an event at `probe_micros`, or None if `struct` only renames a
        window defined elsewhere."""
        fixed = self._at_instant(struct, probe_micros)
        if not fixed.references().isEmpty():
            return None
        value = fixed.eval(None)
        if value is None or value.isNullAt(0) or value.isNullAt(1):
            return None
        return int(value.getLong(0)), int(value.getLong(1))

    def _at_instant(self, expression: JavaObject, micros: int) -> JavaObject:
        """`expression` with the event time (as µs, the form window arithmetic works on) replaced
        by a constant. A subtree with no conversion in it is kept as it is (each py4j call is a
        round trip, and a validation under load waits on each)."""
        if self._is(expression, _TIMESTAMP_CONVERSION):
            long_type = self._jvm_member("org.apache.spark.sql.types.DataTypes.LongType")
            if expression.toType().equals(long_type):
                return self._jvm_member(f"{_CATALYST}.expressions.Literal")(micros, long_type)
        children = _seq(expression.children())
        fixed = [self._at_instant(child, micros) for child in children]
        if all(new is old for new, old in zip(fixed, children, strict=True)):
            return expression
        return expression.withNewChildren(self._scala_seq(fixed))

    # -- lineage ---------------------------------------------------------------------------------
    def output(self) -> list[tuple[str, JavaObject]]:
        """The plan's output attributes by name, in output order."""
        return [(str(a.name()), a) for a in _seq(self._root.output())]

    def is_group(self, attribute: JavaObject) -> bool:
        """Whether an output column belongs in the result key. When the plan does not decide,
        every column that is not an aggregate result does: an extra key part never merges two
        groups, a missing one would."""
        origins = self.origins(attribute)
        return Origin.AGGREGATE not in origins and bool(origins & {Origin.GROUP, Origin.UNKNOWN})

    def origins(self, attribute: JavaObject) -> set[Origin]:
        return self._origins(self._root, _expr_id(attribute))

    def _origins(self, node: JavaObject, expr_id: int) -> set[Origin]:
        if self._is(node, _AGGREGATE):
            for named in _seq(node.aggregateExpressions()):
                if _expr_id(named) == expr_id:
                    return self._aggregated(named)
            return {Origin.UNKNOWN}
        for expression in _seq(node.expressions()):
            if self._is(expression, _ALIAS) and _expr_id(expression) == expr_id:
                return self._derived(node, expression)
        for child in _seq(node.children()):
            if any(_expr_id(a) == expr_id for a in _seq(child.output())):
                return self._origins(child, expr_id)
        # Made by this node: a source, or an operator (Expand, Generate, a stateful function) whose
        # output we do not trace through.
        return {Origin.UNKNOWN}

    def _aggregated(self, named: JavaObject) -> set[Origin]:
        """An output of an Aggregate: an aggregate result, or made of its grouping expressions
        (the analyser accepts nothing else outside an aggregate function)."""
        if self._contains_aggregate(named):
            return {Origin.AGGREGATE}
        references = _seq(named.references().toSeq())
        if not references:
            return set()
        if all(_has_marker(a, TIME_WINDOW_MARKER) for a in references):
            return {Origin.WINDOW}
        return {Origin.GROUP}

    def _derived(self, node: JavaObject, alias: JavaObject) -> set[Origin]:
        """A column computed by `alias` of `node` from its children's columns."""
        if _has_marker(alias, TIME_WINDOW_MARKER) and not self._is(alias.child(), _ATTRIBUTE):
            return {Origin.WINDOW}  # the window definition itself (a rename is traced like any column)
        if self._contains_aggregate(alias):
            return {Origin.AGGREGATE}
        origins: set[Origin] = set()
        children = _seq(node.children())
        for reference in _seq(alias.references().toSeq()):
            expr_id = _expr_id(reference)
            owner = next((c for c in children if any(_expr_id(a) == expr_id for a in _seq(c.output()))), None)
            origins |= {Origin.UNKNOWN} if owner is None else self._origins(owner, expr_id)
        return origins

    def _contains_aggregate(self, expression: JavaObject) -> bool:
        if self._is(expression, _AGGREGATE_EXPRESSION) or self._is(expression, _AGGREGATE_FUNCTION):
            return True
        return any(self._contains_aggregate(child) for child in _seq(expression.children()))

    # -- py4j ------------------------------------------------------------------------------------
    def _nodes(self) -> list[JavaObject]:
        nodes, pending = [], [self._root]
        while pending:
            node = pending.pop()
            nodes.append(node)
            pending.extend(_seq(node.children()))
        return nodes

    def _class(self, name: str) -> JavaObject:
        if name not in self._classes:
            loader = self._jvm_member("java.lang.Thread").currentThread().getContextClassLoader()
            self._classes[name] = self._jvm_member("java.lang.Class").forName(name, False, loader)
        return self._classes[name]

    def _is(self, obj: JavaObject, class_name: str) -> bool:
        return bool(self._class(class_name).isInstance(obj))

    def _scala_seq(self, items: list[JavaObject]) -> JavaObject:
        return self._jvm_member("scala.jdk.javaapi.CollectionConverters").asScala(items).toSeq()

    def _jvm_member(self, dotted: str) -> JavaObject:
        """A JVM class, object or static field by its full name, looked up once: py4j resolves each segment of
        `jvm.a.b.C` with a round trip of its own."""
        if dotted not in self._members:
            found = self._jvm
            for part in dotted.split("."):
                found = getattr(found, part)
            self._members[dotted] = found
        return self._members[dotted]


def _seq(scala_seq: JavaObject) -> list[JavaObject]:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _expr_id(named: JavaObject) -> int:
    return int(named.exprId().id())


def _has_marker(named: JavaObject, marker: str) -> bool:
    return bool(named.metadata().contains(marker))
