"""The root cause of a failure, in one line: the user's own exception or SQL error.

Spark hands a failure back through several wrappers. A batch that fails inside a `foreachBatch`
function reaches Python as a StreamingQueryException whose message is "An exception was raised by
the Python Proxy. Return Message: Traceback ...", and inside that text sits the converted Spark
error ("[USER_RAISED_EXCEPTION] poison row") or, for a Python UDF, a second traceback from the
Python worker that ends with the user's own "RuntimeError: ...". A py4j call that fails raises a
Py4JJavaError whose Java exception has a chain of causes. `root_cause` walks the Python chain
(`__cause__`, `__context__`, PySpark's converted `_cause`), the Java chain (`getCause()`) and the
texts they carry, innermost first, and returns the first line that is not a wrapper.

It needs no Spark: it reads attributes and texts only, so the status path and the tests can use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import structlog

log = structlog.get_logger(__name__)

MAX_DEPTH = 32  # cause chains are short; this only guards against a cycle we failed to see
MAX_LENGTH = 500  # one line, for a status table and a log line

# Messages that only say "something below failed".
WRAPPERS = (
    "An exception was raised by the Python Proxy",
    "An error occurred while calling",
    "An exception was thrown from the Python worker",
    "Job aborted due to stage failure",
    "Job aborted",
    "Writing job aborted",
    "Task failed while writing rows",
    "[FOREACH_BATCH_USER_FUNCTION_ERROR]",
    "Query terminated with exception",
    "[STREAM_FAILED]",
    "[TASK_WRITE_FAILED]",
    "Traceback (most recent call last)",
)
# Exception classes that only wrap another (Java and Python names).
WRAPPER_CLASSES = frozenset(
    {
        "Py4JJavaError",
        "Py4JException",
        "StreamingQueryException",
        "InvocationTargetException",
        "ExecutionException",
        "UndeclaredThrowableException",
        "CompletionException",
    }
)
# What a query's stop() does to the batch it cancels: expected when a query is stopped.
CANCELLATIONS = (
    "java.lang.InterruptedException",
    "java.nio.channels.ClosedByInterruptException",
    "java.io.InterruptedIOException",
    "org.apache.spark.TaskKilledException",
)
_CANCELLED_JOB = re.compile(r"\bJob \d+ cancelled\b|\bcancelled because\b|\bwas cancelled\b")

_TRACEBACK = "Traceback (most recent call last):"

# A checkpoint another Spark session still writes: a stalled executor's queries, whose JVM kept
# running while its Python process (and so its lease) stood still (README, "Guarantees").
CHECKPOINT_CONFLICTS = ("CONCURRENT_STREAM_LOG_UPDATE", "Multiple streaming jobs detected")


# Begins the message of every failure to write a table sink (service_sink.errors.SinkUnavailable):
# an outage of the sink's database or store, not a fault of the query.
SINK_OUTAGE = "sink unavailable"


def is_sink_outage(failure: str) -> bool:
    """Whether a query died because its sink could not be written (not because of its rows)."""
    return SINK_OUTAGE in failure


def is_checkpoint_conflict(failure: str) -> bool:
    """Whether a query died because another query wrote its checkpoint's log at the same time."""
    return any(mark in failure for mark in CHECKPOINT_CONFLICTS)


_QUERY_DESCRIPTION = "\n\n=== Streaming Query ==="
_JVM_TRACE = "\n\nJVM stacktrace:"
_CAUSED_BY = re.compile(r"^Caused by: (.+)$", re.MULTILINE)
_LOST_TASK = re.compile(r"most recent failure: Lost task [^:]*?\): (.+)")
_SQLSTATE = re.compile(r"\s+SQLSTATE: [0-9A-Z]{5}\.?$")
# "pkg.module.ClassName: message" (Python) or "org.apache.Foo$Bar: message" (Java).
_HEADER = re.compile(r"^([A-Za-z_][\w.$]*)(?::\s?(.*))?$")


def root_cause(exc: BaseException) -> str:
    """One line holding the root cause of `exc`, never a wrapper's message.

    The chain is read from the outside in, and the first message that is not a wrapper wins: an
    error of ours that names its cause in its own words (a rejected query, say) keeps them, while
    Spark's and py4j's wrappers are looked through, into the texts they carry.
    """
    for text in _texts(exc):
        found = cause_in_text(text)
        if found and not _is_wrapper(found):
            return _one_line(found)
    text = str(exc).strip()
    return _one_line(text.splitlines()[0]) if text else type(exc).__name__


def is_cancellation(exc: BaseException) -> bool:
    """Whether `exc` is what stopping a streaming query does to its batch in flight (an
    interrupted or cancelled job), as opposed to a failure of the query itself."""
    return any(_names_cancellation(text) for text in _texts(exc))


def _names_cancellation(text: str) -> bool:
    return any(name in text for name in CANCELLATIONS) or _CANCELLED_JOB.search(text) is not None


def full_trace(exc: BaseException) -> str:
    """Every message of the chain, outermost first, for the debug log."""
    return "\n--- caused by ---\n".join(_texts(exc))


def cause_in_text(text: str) -> str | None:
    """The innermost cause a failure's text names: the last exception of its last Python
    traceback, else the last Java "Caused by:", else a failed task's exception, else its first line."""
    text = text.split(_QUERY_DESCRIPTION, 1)[0].split(_JVM_TRACE, 1)[0].strip()
    if not text:
        return None
    if _TRACEBACK in text:
        header, rest = _last_python_exception(text)
        if header is not None:
            name = _HEADER.match(header)
            if name is not None and _short(name.group(1)) == "Py4JJavaError" and rest:
                # ": org.apache...Exception: ..." follows, with the Java trace and its causes.
                return _java_cause(rest.lstrip(": ")) or header
            return _python_line(header, rest)
    return _java_cause(text)


def _texts(exc: BaseException) -> Iterator[str]:
    """The messages of the whole chain, outermost first: Python causes, PySpark's converted
    causes and the Java exception's causes."""
    seen: set[int] = set()
    pending: list[Any] = [exc]
    depth = 0
    while pending and depth < MAX_DEPTH:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, BaseException):
            yield _exception_text(current, outermost=depth == 0)
            # A Py4JJavaError's Java exception; a converted PySpark exception's converted cause
            # (its own Java exception, `_origin`, is the same failure as its message).
            pending.append(getattr(current, "java_exception", None))
            pending.append(getattr(current, "_cause", None))
            pending.append(current.__cause__)
            if not current.__suppress_context__:
                pending.append(current.__context__)
        else:
            # A py4j handle on a java.lang.Throwable.
            text = _java_text(current)
            if text is None:
                continue
            yield text
            pending.append(_java_call(current, "getCause"))
        depth += 1


def _exception_text(exc: BaseException, *, outermost: bool) -> str:
    desc = getattr(exc, "_desc", None)  # PySpark's captured exceptions: the message without the JVM trace
    if isinstance(desc, str) and desc.strip():
        return desc
    if getattr(exc, "java_exception", None) is not None:
        return "An error occurred while calling Java"  # a Py4JJavaError: its text is its Java exception's
    text = str(exc).strip()
    if outermost:
        return text or type(exc).__name__
    # A cause found below a wrapper: its class says what it is.
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _java_text(throwable: Any) -> str | None:
    text = _java_call(throwable, "toString")  # "class.Name: message"
    return None if text is None else str(text)


def _java_call(obj: Any, method: str) -> Any:
    try:
        return getattr(obj, method)()
    except Exception:  # noqa: BLE001 - a py4j handle whose gateway is gone: the chain simply ends here
        return None


def _last_python_exception(text: str) -> tuple[str | None, str]:
    """The exception line that ends the last traceback in `text`, and what follows it."""
    tail = text[text.rindex(_TRACEBACK) + len(_TRACEBACK) :]
    lines = tail.splitlines()
    last_frame = max((i for i, line in enumerate(lines) if line[:1].isspace()), default=-1)
    for i in range(last_frame + 1, len(lines)):
        if lines[i].strip():
            return lines[i].strip(), "\n".join(lines[i + 1 :]).strip()
    return None, ""


def _java_cause(text: str) -> str | None:
    causes = _CAUSED_BY.findall(text)
    candidates = [c.strip() for c in causes]
    lost = _LOST_TASK.search(text)
    if lost is not None:
        candidates.insert(0, lost.group(1).strip())
    first = text.strip().splitlines()[0].strip() if text.strip() else ""
    for candidate in reversed(candidates):
        formatted = _java_line(candidate)
        if not _is_wrapper(formatted):
            return formatted
    return _java_line(first) if first else None


def _java_line(header: str) -> str:
    """A "qualified.ClassName: message" line (Java, or Python's from a traceback) as shown."""
    match = _HEADER.match(header.strip())
    if match is None or "." not in match.group(1):
        return header.strip()
    return _line(match.group(1), (match.group(2) or "").strip())


def _python_line(header: str, rest: str) -> str:
    """The exception line that ends a traceback, as shown."""
    match = _HEADER.match(header)
    if match is None:
        return header
    message = (match.group(2) or "").strip()
    if not message and rest and not rest.startswith(("Traceback", "During handling")):
        message = rest.splitlines()[0].strip()
    return _line(match.group(1), message)


def _line(name: str, message: str) -> str:
    """Spark's own errors keep their message only (it starts with its error class, as PySpark
    shows it); anything else keeps its class: "RuntimeError: flaky dependency",
    "ArithmeticException: / by zero"."""
    short = _short(name)
    if not message:
        return short
    if short in WRAPPER_CLASSES or message.startswith("["):
        return message
    if name.startswith(("org.apache.spark.", "pyspark.errors.")):
        return message
    return f"{short}: {message}"


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1].rsplit("$", 1)[-1]


def _is_wrapper(line: str) -> bool:
    stripped = line.strip()
    name = _HEADER.match(stripped)
    if name is not None and _short(name.group(1)) in WRAPPER_CLASSES and not name.group(2):
        return True
    return any(stripped.startswith(prefix) for prefix in WRAPPERS)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    line = _SQLSTATE.sub("", line)
    return line if len(line) <= MAX_LENGTH else line[: MAX_LENGTH - 1] + "…"


def first_line(exc: BaseException) -> str:
    """The one-line reason of a failure: its root cause (contract.causes), never a py4j or Python
    Proxy wrapper. The whole chain goes to the debug log, once per failure."""
    cause = root_cause(exc)
    if cause not in _traced:
        _traced.append(cause)
        del _traced[:-_TRACED_KEPT]
        log.debug("failure trace", cause=cause, trace=full_trace(exc))
    return cause


# Failures whose trace went to the debug log already: a dead query's failure is read again on every
# tick until it is restarted, and its trace is worth one entry, not one per tick.
_TRACED_KEPT = 64
_traced: list[str] = []
