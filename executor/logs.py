"""Logging set-up: readable lines on a terminal, JSON lines with --log-format json.

Every line goes through one handler on the root logger, whose structlog ProcessorFormatter renders
both hotswap's own structlog events and the standard-library records of the libraries underneath
(kafka-python, py4j, pyspark, urllib3...): the same format, timestamp, level and logger name, and
the context bound with structlog.contextvars (namespace, swap_id, query_id), so a JSON reader sees
one kind of line.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from structlog.typing import Processor

from hotswap.contract.causes import is_cancellation, root_cause

# Chatty at INFO (kafka-python logs every connection and rebalance; py4j every gateway call): kept
# at WARNING unless the operator asks for debug.
NOISY_LOGGERS = ("kafka", "py4j", "pyspark", "urllib3", "asyncio", "filelock")

# The handler configure_logging installed last, so a second call replaces it instead of doubling lines.
_installed: logging.Handler | None = None

# py4j's logger for exceptions raised in Python code that Java called: a foreachBatch function.
PROXY_LOGGER = "py4j.clientserver"


class BatchFunctionErrors(logging.Filter):
    """py4j logs every exception a `foreachBatch` function raises ("There was an exception while
    executing the Python Proxy on the Python Side.") at ERROR with its whole traceback, Java stack
    trace included: about 400 lines. What happens next is Spark's and hotswap's to say: the
    query fails, and hotswap reports the failure in one line with its root cause. So:

    - a batch cancelled because its query was stopped (the writer of a retired graph, interrupted
      in `.save()`) is expected, not an error: the record goes to the debug log only;
    - any other failure keeps its level, cut to one line that names the root cause.

    Either way the whole trace goes to the debug log (`--log-level debug`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            return True
        logging.getLogger("hotswap.spark").debug("batch function trace", exc_info=record.exc_info)
        if is_cancellation(exc):
            return False
        record.msg = "a batch function failed: %s"
        record.args = (root_cause(exc),)
        record.exc_info = None
        record.exc_text = None
        return True


class RetriedKafkaErrors(logging.Filter):
    """kafka-python 3 logs transient errors at ERROR although its client retries them at once, or
    they concern a connection already closed: a failed metadata refresh ("Metadata refresh: failed
    Transport closed for writes"), a send on a connection the broker already closed ("Error sending
    request data: [Errno 32] Broken pipe", with a traceback), and a read task that wakes after its
    own connection closed ("Unhandled exception in task ...: ValueError: Invalid file descriptor: -1",
    with two tracebacks; seen once in `make demo`), and a read on a connection closed under it
    ("<KafkaTCPTransport ... (closed)>: Error receiving network data closing socket", AttributeError:
    its socket is already None; seen once in `make demo`). A failure that persists surfaces as the
    operation that needed it failing, which hotswap reports in one line. So these records go to debug."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        refresh = record.msg == "Metadata refresh: failed %s"
        lost = "Error sending request data" in str(record.msg) and isinstance(exc, ConnectionError)
        closed = (
            str(record.msg).startswith("Unhandled exception in task")
            and isinstance(exc, ValueError)
            and "Invalid file descriptor" in str(exc)
        )
        closed_read = (
            "Error receiving network data" in str(record.msg)
            and isinstance(exc, AttributeError)
            and isinstance(record.args, tuple)
            and len(record.args) > 0
            and str(record.args[0]).endswith("(closed)>")
        )
        if refresh or lost or closed or closed_read:
            # Handlers compare the record's level with their own: at info, this one is dropped.
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def configure_logging(log_format: str = "console", level: str = "info", stream: TextIO | None = None) -> None:
    """Route structlog and the standard library's logging to `stream` (default stderr) in one format.
    Safe to call again: the latest call wins."""
    global _installed
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    out = stream if stream is not None else sys.stderr
    # What every line gets, whether it came from structlog or from a library's stdlib logger.
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    rendering: list[Processor] = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if log_format == "json":
        rendering += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        colors = out.isatty()
        # No locals in tracebacks: they can hold the Redis URL with its password, or a query's rows.
        tracebacks = structlog.dev.RichTracebackFormatter(
            color_system="truecolor" if colors else None, show_locals=False
        )
        rendering.append(structlog.dev.ConsoleRenderer(colors=colors, exception_formatter=tracebacks))
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=rendering))
    handler.setLevel(numeric)
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    root.addHandler(handler)
    root.setLevel(numeric)
    _installed = handler
    quiet = logging.NOTSET if numeric <= logging.DEBUG else max(numeric, logging.WARNING)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(quiet)
    # kafka-python 3 warns whenever one of its network tasks takes over 100 ms ("It is blocking the
    # event loop"), which a busy machine causes, not a fault: shown only at debug.
    logging.getLogger("kafka.net.selector").setLevel(logging.NOTSET if numeric <= logging.DEBUG else logging.ERROR)
    # kafka-python's connection chatter (a connect refused, a node disconnected, a metadata refresh
    # failed: dozens of lines a second while a broker is away) goes to debug only. hotswap says an
    # outage once when it begins and once when it ends (contract/outages.py), and any operation
    # that fails for good says so itself, in one line.
    logging.getLogger("kafka").setLevel(logging.NOTSET if numeric <= logging.DEBUG else logging.CRITICAL)
    proxy = logging.getLogger(PROXY_LOGGER)
    if not any(isinstance(f, BatchFunctionErrors) for f in proxy.filters):
        proxy.addFilter(BatchFunctionErrors())
    for name in ("kafka.cluster", "kafka.net.transport", "kafka.net.selector"):
        kafka = logging.getLogger(name)
        if not any(isinstance(f, RetriedKafkaErrors) for f in kafka.filters):
            kafka.addFilter(RetriedKafkaErrors())
