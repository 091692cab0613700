"""The root cause of a failure, in one line (contract/causes.py), on the texts Spark really produced.

The fixture spark_failures.json holds what PySpark 4.2 gave for four failures, captured once on
this stack: a foreachBatch whose write hits `raise_error('poison row')`, one whose Python UDF
raises, a batch write hitting `raise_error` directly, and a foreachBatch function raising itself.
The exception objects around those texts are rebuilt here with the shapes PySpark and py4j give
them (a captured exception's `_desc` and converted `_cause`; a Py4JJavaError's `java_exception`
with its Java `getCause()` chain)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from hotswap.contract.causes import cause_in_text, first_line, full_trace, is_cancellation, root_cause
from hotswap.execution_graph.errors import QueryRejected
from hotswap.executor.logs import PROXY_LOGGER, BatchFunctionErrors

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "spark_failures.json").read_text())
WRAPPERS = ("Python Proxy", "Py4J", "py4j", "Traceback", "An error occurred while calling", "\n")


class JavaThrowable:
    """A py4j handle on a java.lang.Throwable: toString() is "class: message"."""

    def __init__(self, class_name: str, message: str | None, cause: JavaThrowable | None = None) -> None:
        self._class = class_name
        self._message = message
        self._cause = cause

    def toString(self) -> str:
        return self._class if self._message is None else f"{self._class}: {self._message}"

    def getCause(self) -> JavaThrowable | None:
        return self._cause


class Py4JJavaErrorLike(Exception):
    """py4j.protocol.Py4JJavaError's shape: its text is fetched from its Java exception."""

    def __init__(self, java_exception: JavaThrowable) -> None:
        super().__init__("An error occurred while calling o4585.save.\n")
        self.java_exception = java_exception


class CapturedLike(Exception):
    """PySpark's CapturedException shape: `_desc` without the JVM trace, the Java cause converted."""

    def __init__(self, desc: str, cause: BaseException | None = None) -> None:
        super().__init__(desc + "\n\nJVM stacktrace:\norg.apache.spark...")
        self._desc = desc
        self._cause = cause


def streaming_failure(case: str) -> CapturedLike:
    """What `StreamingQuery.exception()` returns for a captured case: a StreamingQueryException whose
    converted cause is the Py4JException carrying the Python Proxy's text."""
    desc = FIXTURES[case]["desc"]
    return CapturedLike(desc, cause=CapturedLike(desc))


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        ("sql_raise_error", "[USER_RAISED_EXCEPTION] poison row"),
        ("python_udf", "RuntimeError: poison row in a udf"),
        ("batch_py4j", "[USER_RAISED_EXCEPTION] poison row"),
        ("foreach_python_raise", "ValueError: bad writer config"),
    ],
)
def test_a_captured_spark_failure_is_its_users_own_error_in_one_line(case: str, cause: str) -> None:
    assert root_cause(streaming_failure(case)) == cause
    assert first_line(streaming_failure(case)) == cause


def test_the_texts_spark_produced_name_their_cause() -> None:
    assert cause_in_text(FIXTURES["sql_raise_error"]["desc"]) == "[USER_RAISED_EXCEPTION] poison row SQLSTATE: P0001"
    assert cause_in_text(FIXTURES["python_udf"]["desc"]) == "RuntimeError: poison row in a udf"
    assert FIXTURES["sql_raise_error"]["desc"].startswith("An exception was raised by the Python Proxy")


def test_a_py4j_error_is_looked_through_to_the_deepest_java_cause() -> None:
    chain = JavaThrowable(
        "org.apache.spark.SparkException",
        "Job aborted.",
        JavaThrowable(
            "java.util.concurrent.ExecutionException",
            None,
            JavaThrowable(
                "org.apache.spark.SparkRuntimeException", "[USER_RAISED_EXCEPTION] poison row SQLSTATE: P0001"
            ),
        ),
    )
    assert root_cause(Py4JJavaErrorLike(chain)) == "[USER_RAISED_EXCEPTION] poison row"


def test_a_failed_task_inside_a_job_abort_message_is_found() -> None:
    text = (
        "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times, "
        "most recent failure: Lost task 0.0 in stage 3.0 (TID 3) (127.0.0.1 executor driver): "
        "java.lang.ArithmeticException: / by zero\n\tat Foo.bar(Foo.java:1)\n"
    )
    assert root_cause(Py4JJavaErrorLike(JavaThrowable("org.apache.spark.SparkException", text[33:]))) == (
        "ArithmeticException: / by zero"
    )


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


def test_an_error_of_ours_keeps_its_own_words() -> None:
    rejected = chained(QueryRejected("query 'x' does not analyse: column nope"), ValueError("inner detail"))
    assert root_cause(rejected) == "query 'x' does not analyse: column nope"
    assert root_cause(ValueError("plain")) == "plain"
    assert root_cause(RuntimeError()) == "RuntimeError"


def test_a_wrapper_of_a_python_error_names_its_class() -> None:
    outer = chained(CapturedLike("An exception was raised by the Python Proxy. Return Message: none"), KeyError("x"))
    assert root_cause(outer) == "KeyError: 'x'"


def test_an_interrupted_write_is_a_cancellation_and_a_poison_row_is_not() -> None:
    interrupted = Py4JJavaErrorLike(JavaThrowable("java.lang.InterruptedException", None))
    assert is_cancellation(interrupted)
    assert not is_cancellation(streaming_failure("sql_raise_error"))
    assert "java.lang.InterruptedException" in full_trace(interrupted)


def record(exc: BaseException) -> logging.LogRecord:
    return logging.LogRecord(
        PROXY_LOGGER,
        logging.ERROR,
        __file__,
        1,
        "There was an exception while executing the Python Proxy on the Python Side.",
        (),
        (type(exc), exc, None),
    )


def test_the_py4j_log_of_a_stopped_querys_writer_goes_to_debug_only() -> None:
    interrupted = Py4JJavaErrorLike(JavaThrowable("java.lang.InterruptedException", None))
    assert BatchFunctionErrors().filter(record(interrupted)) is False


def test_the_py4j_log_of_a_real_failure_is_one_line_with_its_cause() -> None:
    entry = record(streaming_failure("python_udf"))
    assert BatchFunctionErrors().filter(entry) is True
    assert entry.getMessage() == "a batch function failed: RuntimeError: poison row in a udf"
    assert entry.exc_info is None
    assert entry.levelno == logging.ERROR


def test_a_root_cause_is_one_short_line_without_wrappers() -> None:
    for case in FIXTURES:
        found: Any = root_cause(streaming_failure(case))
        assert not any(w in found for w in WRAPPERS), found
        assert len(found) <= 500


def test_kafka_errors_its_client_retries_go_to_debug_and_others_stay() -> None:
    from hotswap.executor.logs import RetriedKafkaErrors

    def kafka_record(
        msg: str, exc: BaseException | None = None, args: tuple[str, ...] = ("x", "y")
    ) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc else None
        return logging.LogRecord("kafka.cluster", logging.ERROR, __file__, 1, msg, args, info)

    receiving = "%s: Error receiving network data closing socket"
    no_socket = AttributeError("'NoneType' object has no attribute 'recv'")

    for retried in (
        kafka_record("Metadata refresh: failed %s"),
        kafka_record("%s: Error sending request data: %s", BrokenPipeError(32, "Broken pipe")),
        kafka_record("Unhandled exception in task %s:", ValueError("Invalid file descriptor: -1")),
        kafka_record(receiving, no_socket, ("<KafkaTCPTransport [none] (closed)>",)),
    ):
        assert RetriedKafkaErrors().filter(retried)
        assert retried.levelno == logging.DEBUG
    for kept in (
        kafka_record("Topic %s is not authorized for this client"),
        kafka_record("%s: Error sending request data: %s", ValueError("bad frame")),
        kafka_record("Unhandled exception in task %s:", RuntimeError("EVENT_READ already registered")),
        kafka_record(receiving, no_socket, ("<KafkaTCPTransport 127.0.0.1:9092 (connected)>",)),
        kafka_record(receiving, OSError("reset"), ("<KafkaTCPTransport [none] (closed)>",)),
    ):
        assert RetriedKafkaErrors().filter(kept)
        assert kept.levelno == logging.ERROR
