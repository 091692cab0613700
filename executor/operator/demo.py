"""`hotswap demo`: the whole product on one screen.

Starts the embedded stack, the executor (in this process) and the generator; prints windowed
results as they arrive; submits a replacement query and follows its phases; then stops the load
and checks the results: windows answered per query version, missing windows, duplicates.
`hotswap demo --attach` does the same with an executor and a generator that run elsewhere (the
containers of compose/docker-compose.yml): it starts nothing, and waits for the load to end.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

from hotswap.contract.errors import ConfigError
from hotswap.contract.journal import SwapPhase
from hotswap.contract.models import now_ms
from hotswap.contract.settings import (
    ControlSettings,
    KafkaSettings,
    OperatorSettings,
    PipelineSettings,
    Settings,
)
from hotswap.execution_graph.source import load_query_source
from hotswap.executor.control.controller import Executor
from hotswap.executor.control.spark_session import build_spark_session
from hotswap.executor.operator.client import Client, redis_client
from hotswap.executor.operator.history import history
from hotswap.executor.operator.render import render_history
from hotswap.executor.operator.web import MonitorServer, start_monitor
from hotswap.executor.stack import EmbeddedStack
from hotswap.executor.tools.generator import GeneratorSpec, produce
from hotswap.service_graph.kafka_io import SourceOffsets
from hotswap.service_sink.audit import Result, audit
from hotswap.service_sink.errors import TopicReadIncomplete
from hotswap.service_sink.postgres import check_sink
from hotswap.service_sink.readback import SinkReader

DEMO_METRICS_PORT = 9464  # the dashboard and /metrics (any free port if taken)
TIME_SCALE = 5.0  # event time runs 5x faster than the clock: a 10 s window closes every 2 s
# --attach: the load has ended once the source topic took no event for this long.
QUIET_S = 10.0
# --attach: how much longer than the load's duration the executor gets for a first result and the swap.
ATTACH_GRACE_S = 600.0


class SettingsSource(Protocol):
    def settings(self, **overrides: Any) -> Settings: ...


def _hms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S")


def run_demo(
    options: SettingsSource,
    console: Console,
    query: Path,
    replacement: Path,
    duration_s: float,
    swap_after_s: float,
    keep_stack: bool,
    metrics_port: int = DEMO_METRICS_PORT,
    sink: str | None = None,
    sink_url: str | None = None,
) -> bool:
    namespace = f"demo-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    settings = options.settings(
        namespace=namespace,
        source_topic=f"{namespace}.events",
        sink_topic=f"{namespace}.results",
        sink=sink if sink is not None and not sink.startswith("kafka:") else None,
        sink_url=sink_url,
        lateness="2s",
        log_level="warning",
        metrics_port=metrics_port,
    )
    check_sink(settings.pipeline)
    initial = load_query_source(query)
    swap_source = load_query_source(replacement)
    stack = EmbeddedStack(settings.stack, settings.kafka)
    already_up = all(s.healthy for s in stack.status())
    console.rule("[bold]hotswap demo")
    console.print(f"namespace {namespace}; starting Kafka and Redis ...")
    stack.up()
    stack_ready = time.monotonic()
    console.print("stack up; starting Spark and the executor ...")
    spark = build_spark_session(settings.spark)
    reader = SinkReader(settings.pipeline, settings.kafka, spark)
    client = Client(settings.control, settings.kafka, settings.pipeline, redis_client(settings.control))
    executor = Executor(settings, spark, redis_client(settings.control, report_outages=True))
    monitor = _serve_monitor(
        executor,
        operator=settings.operator,
        control=settings.control,
        kafka=settings.kafka,
        pipeline=settings.pipeline,
    )
    console.print(
        f"dashboard [link={monitor.url}]{monitor.url}[/link]   metrics {monitor.url}metrics\n"
        f"in a second terminal: [bold]hotswap status --watch --namespace {namespace}[/]",
        soft_wrap=True,
    )
    stop_executor = threading.Event()
    stop_load = threading.Event()
    executor_thread = threading.Thread(target=executor.run, args=(initial, stop_executor), daemon=True)
    executor_thread.start()
    spec = GeneratorSpec(rate=200, keys=4, seed=7, duration_s=duration_s, disorder_ms=1000, time_scale=TIME_SCALE)
    load = threading.Thread(target=produce, args=(settings.kafka, spec, settings.source_topic, stop_load), daemon=True)
    swap_id: str | None = None
    shown: set[tuple[str, int]] = set()
    phases_shown = 0
    first_result_at: float | None = None
    # A table is read with a query (a Spark job for Delta): every few seconds, not every second.
    read_every_s = 1.0 if settings.pipeline.sink.is_kafka else 5.0
    last_read = 0.0
    try:
        if not executor.ready.wait(300):
            console.print("[red]the executor did not start within 300 s")
            return False
        load.start()
        console.print(f"generating {spec.rate:.0f} events/s for {duration_s:.0f} s (event time x{TIME_SCALE:.0f})")
        while load.is_alive() or swap_id is None:
            if not executor_thread.is_alive():
                console.print("[red]the executor stopped unexpectedly; see the log above")
                return False
            if time.monotonic() - last_read >= read_every_s:
                first_result_at = _show_new_windows(reader, console, shown, first_result_at, stack_ready)
                last_read = time.monotonic()
            if swap_id is None and first_result_at is not None and time.monotonic() - first_result_at > swap_after_s:
                swap_id = client.submit(replacement, swap_source.name).id
                console.print(f"[bold yellow]submitted swap {swap_id}: {initial.name} -> {swap_source.name}")
            if swap_id is not None:
                phases_shown = _show_phases(client, console, swap_id, phases_shown)
            time.sleep(1.0)
        # Let the last windows close: the watermark needs lateness (in event time) more input.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and swap_id is not None:
            phases_shown = _show_phases(client, console, swap_id, phases_shown)
            if client.journal.get(swap_id).state.is_settled:
                break
            time.sleep(1.0)
        _show_new_windows(reader, console, shown, first_result_at, stack_ready)
    finally:
        stop_load.set()
        stop_executor.set()
        executor_thread.join(timeout=120)
        monitor.stop()
    try:
        # After the executor stopped: a Delta table is read back with a plain Spark batch query.
        ok = _final_check(reader, client, console, swap_id)
    finally:
        spark.stop()
    _show_history(client, console)
    client.close()
    if not keep_stack and not already_up:
        stack.down()
        console.print("stack stopped")
    return ok


def run_attached_demo(
    options: SettingsSource, console: Console, replacement: Path, duration_s: float, swap_after_s: float
) -> bool:
    """The demo against an executor and a generator that run elsewhere: print the windows, submit the
    swap once results flow, follow it, and check the results once the load has ended."""
    settings = options.settings()
    reader = SinkReader(settings.pipeline, settings.kafka)
    swap_source = load_query_source(replacement)
    client = Client(settings.control, settings.kafka, settings.pipeline, redis_client(settings.control))
    console.rule("[bold]hotswap demo (attached)")
    console.print(f"namespace {settings.namespace}: following the executor and the generator that run elsewhere")
    started = time.monotonic()
    deadline = started + duration_s + ATTACH_GRACE_S
    source = SourceOffsets(settings.kafka, settings.source_topic)
    swap_id: str | None = None
    shown: set[tuple[str, int]] = set()
    phases_shown = 0
    first_result_at: float | None = None
    last_end: dict[str, int] = {}
    last_change = time.monotonic()
    try:
        while True:
            first_result_at = _show_new_windows(reader, console, shown, first_result_at, started)
            if swap_id is None and first_result_at is not None and time.monotonic() - first_result_at > swap_after_s:
                current = client.status().current
                swap_id = client.submit(replacement, swap_source.name).id
                serving = current.query_id if current is not None else "the running query"
                console.print(f"[bold yellow]submitted swap {swap_id}: {serving} -> {swap_source.name}")
            if swap_id is not None:
                phases_shown = _show_phases(client, console, swap_id, phases_shown)
            end = source.end()
            if end != last_end:
                last_end, last_change = end, time.monotonic()
            load_ended = sum(end.values()) > 0 and time.monotonic() - last_change >= QUIET_S
            if swap_id is not None and load_ended and client.journal.get(swap_id).state.is_settled:
                break
            if time.monotonic() >= deadline:
                waited = "a first result" if first_result_at is None else "the swap to end and the load to stop"
                console.print(f"[red]gave up after {deadline - started:.0f} s waiting for {waited}")
                break
            time.sleep(1.0)
    finally:
        source.close()
    _show_new_windows(reader, console, shown, first_result_at, started)
    ok = _final_check(reader, client, console, swap_id)
    _show_history(client, console)
    return ok


def _show_new_windows(
    reader: SinkReader,
    console: Console,
    shown: set[tuple[str, int]],
    first: float | None,
    stack_ready: float,
) -> float | None:
    grouped: dict[tuple[str, int, int], list[Result]] = defaultdict(list)
    try:
        results = reader.results(timeout_s=5)
    except TopicReadIncomplete:
        return first  # a slow read only delays the display; the next round shows these windows
    for result in results:
        grouped[(result.query_id, result.window_start, result.window_end)].append(result)
    for (query_id, start, end), rows in sorted(grouped.items(), key=lambda item: item[0][1]):
        if (query_id, start) in shown:
            continue
        shown.add((query_id, start))
        if first is None:
            first = time.monotonic()
            console.print(f"[green]first results {first - stack_ready:.0f} s after the stack was up")
        cells = []
        for r in sorted(rows, key=lambda r: str(r.row.get("key"))):
            measures = [
                f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                for k, v in r.row.items()
                if k not in ("window_start", "window_end", "query_id", "key", "group_key")
            ]
            cells.append(f"{r.row.get('key')} {' '.join(measures)}")
        console.print(f"{_hms(start)}-{_hms(end)} [cyan]{query_id:<16}[/] " + " | ".join(cells), soft_wrap=True)
    return first


def _show_phases(client: Client, console: Console, swap_id: str, shown: int) -> int:
    record = client.journal.get(swap_id)
    for phase in record.phases[shown:]:
        extra = f" (W = {_hms(record.cut_window_end)})" if phase.name is SwapPhase.CUT and record.cut_window_end else ""
        error = f": {record.error}" if record.error and phase.name is record.state else ""
        console.print(f"[bold yellow]swap {swap_id}: {phase.name}{extra}{error}")
    return len(record.phases)


def _serve_monitor(
    executor: Executor,
    *,
    operator: OperatorSettings,
    control: ControlSettings,
    kafka: KafkaSettings,
    pipeline: PipelineSettings,
) -> MonitorServer:
    """The dashboard and metrics on the demo's port, or on any free port if that one is taken."""
    try:
        return start_monitor(executor, operator=operator, control=control, kafka=kafka, pipeline=pipeline)
    except ConfigError:
        anywhere = operator.model_copy(update={"metrics_port": 0})
        return start_monitor(executor, operator=anywhere, control=control, kafka=kafka, pipeline=pipeline)


def _show_history(client: Client, console: Console) -> None:
    console.rule("[bold]hotswap history")
    render_history(history(client.status(), now_ms()), console)


def _final_check(reader: SinkReader, client: Client, console: Console, swap_id: str | None) -> bool:
    results = reader.results()
    report = audit(results)
    console.rule("[bold]check")
    console.print(f"results read back with: {reader.describe}")
    table = Table("query version", "windows answered")
    for query_id, n in sorted(report.windows_by_query.items()):
        table.add_row(query_id, str(n))
    console.print(table)
    swap_ok = False
    if swap_id is not None:
        record = client.journal.get(swap_id)
        swap_ok = record.state is SwapPhase.COMPLETED
        at = {p.name: p.at for p in record.phases}
        took = (at[SwapPhase.COMPLETED] - at[SwapPhase.SUBMITTED]) / 1000 if swap_ok else None
        console.print(
            f"swap {swap_id}: {record.state}"
            + (f" in {took:.1f} s, cut at {_hms(record.cut_window_end or now_ms())}" if took is not None else "")
            + (f" ({record.error})" if record.error else "")
        )
    console.print(f"results: {report.results}")
    console.print(f"missing windows: {len(report.missing_windows)}")
    console.print(f"duplicate results: {report.duplicate_results}")
    console.print(f"windows answered by two versions: {report.overlapping_windows}")
    ok = report.ok and swap_ok and report.results > 0
    console.print("[bold green]OK" if ok else "[bold red]CHECK FAILED")
    return ok
