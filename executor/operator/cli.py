"""The `hotswap` command line."""

from __future__ import annotations

import json
import os
import signal
import threading
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from hotswap.contract.errors import ConfigError
from hotswap.contract.models import GraphEngine
from hotswap.contract.settings import Settings, load_settings
from hotswap.contract.source import AvroWire, EpochUnit, SourceFormat
from hotswap.executor.logs import configure_logging
from hotswap.executor.operator.failures import operator_errors
from hotswap.executor.operator.render import console, iso, render_diff, render_history, render_plan, render_status
from hotswap.executor.operator.stack_cli import stack_app

if TYPE_CHECKING:  # heavy imports, made only by the commands that run Spark
    from pyspark.sql import SparkSession
    from redis import Redis

E = TypeVar("E", bound=StrEnum)
EXIT_CODES = (
    "Exit codes: 0 success; 1 a failure named in one line on stderr (a rejected query, a failed or timed-out "
    "swap, Redis or Kafka unreachable); 2 a usage error (an unknown option, a missing argument); 130 interrupted "
    "(Ctrl-C) while waiting."
)

app = typer.Typer(
    help=f"Replace a running Spark Structured Streaming query live.\n\n{EXIT_CODES}",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(stack_app, name="stack")


class Globals:
    def __init__(self, namespace: str | None, log_format: str | None, log_level: str | None) -> None:
        self.namespace = namespace
        self.log_format = log_format
        self.log_level = log_level

    def settings(self, **overrides: Any) -> Settings:
        given = {"namespace": self.namespace, "log_format": self.log_format, "log_level": self.log_level}
        given.update({k: v for k, v in overrides.items() if v is not None})
        settings = load_settings(**given)
        configure_logging(settings.log_format, settings.log_level)
        return settings


NamespaceOpt = Annotated[str | None, typer.Option("--namespace", "-n", help="Deployment namespace.")]


@app.callback()
def main_options(
    ctx: typer.Context,
    namespace: NamespaceOpt = None,
    log_format: Annotated[str | None, typer.Option(help="console or json.")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning, error.")] = None,
    config: Annotated[Path | None, typer.Option(help="TOML settings file (default ./hotswap.toml).")] = None,
) -> None:
    if config is not None:
        os.environ["HOTSWAP_CONFIG_FILE"] = str(config)
    ctx.obj = Globals(namespace, log_format, log_level)


# -- run ----------------------------------------------------------------------------------------
@app.command()
@operator_errors
def run(
    ctx: typer.Context,
    query: Annotated[Path, typer.Option(help="The initial query: a .sql or .py file.")],
    name: Annotated[str | None, typer.Option(help="Query id (default: the file name).")] = None,
    window: Annotated[str | None, typer.Option(help="Service graph window, e.g. 10s.")] = None,
    lateness: Annotated[str | None, typer.Option(help="Allowed lateness, e.g. 5s.")] = None,
    source_topic: Annotated[str | None, typer.Option(help="Source topic.")] = None,
    sink_topic: Annotated[str | None, typer.Option(help="Results topic.")] = None,
    sink: Annotated[
        str | None,
        typer.Option(
            help="Where results land: kafka:TOPIC (default kafka:<sink topic>), postgres:TABLE with --sink-url, or "
            "delta:PATH (docs/sinks.md)."
        ),
    ] = None,
    sink_url: Annotated[
        str | None,
        typer.Option(
            help="The postgres sink's database: postgresql://USER:PASSWORD@HOST:5432/DB (or HOTSWAP_SINK_URL)."
        ),
    ] = None,
    namespace: NamespaceOpt = None,
    log_format: Annotated[str | None, typer.Option(help="console or json.")] = None,
    keep_retired_topics: Annotated[bool | None, typer.Option(help="Keep a retired graph's topic.")] = None,
    spark_master: Annotated[
        str | None,
        typer.Option(help="Spark master: local[*], spark://HOST:PORT, k8s://https://HOST:PORT (default local[2])."),
    ] = None,
    spark_remote: Annotated[
        str | None,
        typer.Option(
            help="Spark Connect URL (sc://HOST:PORT): refused, see docs/operations.md, 'Running on a cluster'."
        ),
    ] = None,
    lease_wait: Annotated[
        str | None,
        typer.Option(help="Wait this long for a stalled executor's lease to expire (default 20s; 0s: refuse at once)."),
    ] = None,
    reset_namespace: Annotated[
        bool,
        typer.Option(
            "--reset-namespace",
            help="First remove the namespace's Redis keys, checkpoints and hotswap topics, and start it over "
            "(after its control state was lost). The source and results topics are kept.",
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask before --reset-namespace.")] = False,
    source_format: Annotated[
        SourceFormat | None, typer.Option(help="How the source's records are written: json or avro (default json).")
    ] = None,
    source_schema: Annotated[
        str | None,
        typer.Option(
            help="The records' schema as Spark DDL, e.g. 'order_id STRING, customer STRUCT<id: BIGINT>, "
            "created_at TIMESTAMP' (default: 'key STRING NOT NULL, value DOUBLE NOT NULL, ts BIGINT NOT NULL')."
        ),
    ] = None,
    avro_schema: Annotated[
        Path | None, typer.Option(help="With --source-format avro: the records' Avro schema (.avsc).")
    ] = None,
    avro_wire: Annotated[
        AvroWire | None,
        typer.Option(help="Avro framing: confluent (a magic byte and a schema id first; default) or plain."),
    ] = None,
    event_time: Annotated[
        str | None,
        typer.Option(help="The event-time column, a dotted path into a struct (meta.ts), or 'kafka' (default ts)."),
    ] = None,
    event_time_unit: Annotated[
        EpochUnit | None, typer.Option(help="Unit of an integer event-time column: ms, s or us (default ms).")
    ] = None,
    timestamp_format: Annotated[
        str | None, typer.Option(help="A Spark datetime pattern for timestamps that are not ISO-8601 (JSON).")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Serve Prometheus metrics (/metrics) and the dashboard (/) on this port; 0: any free port."),
    ] = None,
    metrics_host: Annotated[
        str | None, typer.Option(help="Address the metrics and dashboard listen on (default 127.0.0.1).")
    ] = None,
    graph_engine: Annotated[
        GraphEngine | None,
        typer.Option(
            help="How execution graphs deployed from now on compute their windows: closing (each window once, as a "
            "batch, when it closes; default) or stateful (a Spark streaming aggregation)."
        ),
    ] = None,
    graph_partitions: Annotated[
        int | None,
        typer.Option(help="Partitions of a closing graph's topic (default: as many as the source topic has)."),
    ] = None,
) -> None:
    """Run the executor in the foreground (Ctrl-C stops it; a restart resumes).

    The executor is hotswap's controller process (and the Spark driver): not one of Spark's executors.

    Exit codes: 0 stopped on Ctrl-C or SIGTERM; 1 a failure named in one line (lease held by another executor,
    lost lease or control state, the service graph failing for good, a port or setting refused); 2 a usage error.
    """
    from hotswap.contract.names import Keys
    from hotswap.execution_graph.checkpoint import check_checkpoints
    from hotswap.execution_graph.source import load_query_source
    from hotswap.executor.control.controller import Executor
    from hotswap.executor.control.durability import check_durability
    from hotswap.executor.control.lease import Lease
    from hotswap.executor.control.spark_session import build_spark_session, check_spark_target
    from hotswap.executor.operator.client import redis_client
    from hotswap.service_sink.postgres import check_sink

    settings = ctx.obj.settings(
        window=window,
        lateness=lateness,
        source_topic=source_topic,
        sink_topic=sink_topic,
        sink=sink,
        sink_url=sink_url,
        namespace=namespace,
        log_format=log_format,
        keep_retired_topics=keep_retired_topics,
        lease_wait=lease_wait,
        spark_master=spark_master,
        spark_remote=spark_remote,
        source_format=source_format,
        source_schema=source_schema,
        avro_schema=avro_schema,
        avro_wire=avro_wire,
        event_time=event_time,
        event_time_unit=event_time_unit,
        timestamp_format=timestamp_format,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        graph_engine=graph_engine,
        graph_partitions=graph_partitions,
    )
    settings.source_spec()  # a bad source declaration fails here, in one line, before anything starts
    check_spark_target(settings.spark)  # before the lease or Redis: a target that cannot work changes nothing
    check_sink(settings.pipeline)  # a sink that cannot be written is said now, not at the first result
    source = load_query_source(query, name)
    client = redis_client(settings.control, report_outages=True)
    check_durability(client, settings.control)  # before Spark starts: a Redis that may lose a cut is refused at once
    Lease(client, Keys(settings.namespace).lease, settings.lease_ttl.ms).wait_until_free(settings.lease_wait.s)
    if reset_namespace and not yes:
        typer.confirm(
            f"Remove every Redis key, checkpoint and hotswap.{settings.namespace}.* topic of namespace "
            f"{settings.namespace!r}? It starts over from the first offset of {settings.source_topic}."
            f"{_table_kept(settings)}",
            abort=True,
        )
    if not reset_namespace:
        _refuse_lost_state(settings, client)  # in a second, not after Spark's start
    # Before the reset: checkpoints on an object store are removed through Spark's Hadoop client.
    spark = build_spark_session(settings.spark)
    monitor = None
    try:
        check_checkpoints(settings.names.checkpoint_root, spark)
        if reset_namespace:
            _reset_namespace(settings, client, spark)
        # From here Ctrl-C stops the executor gracefully; before, it interrupts the check or the reset.
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        executor = Executor(settings, spark, client)
        if settings.metrics_port is not None:
            from hotswap.executor.operator.web import start_monitor

            monitor = start_monitor(
                executor,
                operator=settings.operator,
                control=settings.control,
                kafka=settings.kafka,
                pipeline=settings.pipeline,
            )
        executor.run(source, stop)
    finally:
        if monitor is not None:
            monitor.stop()
        spark.stop()


def _table_kept(settings: Settings) -> str:
    """What --reset-namespace leaves: a table sink is the user's, and the windows computed again land
    in it once more."""
    table = settings.pipeline.sink
    if not table.is_table:
        return ""
    return (
        f" The rows already in {table} stay: empty it first, or every window computed again is written over "
        "its row (postgres) or appended beside it (delta)."
    )


def _refuse_lost_state(settings: Settings, client: Redis) -> None:
    """Refuse a namespace whose Redis lost its control state while its checkpoints remain, before
    Spark starts. The executor asks again under its lease, of its topics too, and of checkpoints on
    an object store (read through Spark)."""
    from hotswap.contract.names import is_store_uri
    from hotswap.execution_graph.checkpoint import check_checkpoints, root_files
    from hotswap.executor.control.namespace import refuse_lost_state

    root = settings.names.checkpoint_root
    if not is_store_uri(root):
        check_checkpoints(root, None)  # a root that cannot be read or written is said as such, first
        refuse_lost_state(client, settings.control, None, root_files(root, None))


def _reset_namespace(settings: Settings, client: Redis, spark: SparkSession) -> None:
    """Remove the namespace's Redis keys, checkpoints and owned topics, under its lease: an executor
    starting meanwhile waits, and never finds half a namespace."""
    from hotswap.contract.names import Keys
    from hotswap.execution_graph.checkpoint import root_files
    from hotswap.executor.control.lease import Lease
    from hotswap.executor.control.namespace import reset
    from hotswap.executor.control.topics import Topics

    lease = Lease(client, Keys(settings.namespace).lease, settings.lease_ttl.ms)
    lease.acquire(settings.lease_wait.s)
    topics = Topics(settings.kafka, settings.pipeline, settings.timeouts)
    try:
        checkpoints = root_files(settings.names.checkpoint_root, spark)
        removed = reset(client, settings.control, topics, checkpoints, lease.token)
        lease.check()  # still ours throughout: nobody else can have started on the namespace
    finally:
        topics.close()
        lease.release()
    console.print(
        f"namespace {settings.namespace} reset: removed {', '.join(removed) or 'nothing'}.{_table_kept(settings)}"
    )


# -- submit / abort / status --------------------------------------------------------------------
@app.command()
@operator_errors
def submit(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="The replacement query: a .sql or .py file.")],
    name: Annotated[str | None, typer.Option(help="Query id (default: the file name).")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the swap completes.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait.")] = 600.0,
    fix: Annotated[
        str | None,
        typer.Option(help="Fix forward the swap with this id, whose new query failed for good after its cut."),
    ] = None,
    source_schema: Annotated[
        str | None,
        typer.Option(
            help="The schema this version reads, as Spark DDL (JSON sources), e.g. the running one plus a new "
            "field; default: the schema of the query it replaces."
        ),
    ] = None,
    avro_schema: Annotated[
        Path | None,
        typer.Option(help="The Avro schema (.avsc) this version reads (Avro sources); Avro's resolution rules apply."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Validate against the running query and print the plan (window, groups, schema, the cut W it "
            "would take now and its floor, the queue ahead); change nothing.",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the swap record (or the dry run's plan) as JSON.")
    ] = False,
    auto_rollback: Annotated[
        bool,
        typer.Option(
            "--auto-rollback",
            help="Roll back on its own if the new query fails for good after its cut (or over the error budget "
            "HOTSWAP_ROLLBACK_FAILURES within HOTSWAP_ROLLBACK_WINDOW).",
        ),
    ] = False,
    shadow: Annotated[
        bool,
        typer.Option(
            "--shadow",
            help="Run it as a shadow beside the current query (its results to its own topic) until `hotswap promote "
            "ID`; compare with `hotswap diff ID`, drop with `hotswap abort ID`.",
        ),
    ] = False,
    namespace: NamespaceOpt = None,
) -> None:
    """Submit a replacement query. Prints the swap id; a rejected query prints the reason.

    Exit codes: 0 validated and queued (with --wait: completed; with --dry-run: it would be accepted); 1 rejected,
    failed, timed out, or no executor answering (the reason in one line on stderr; with --dry-run --json the plan
    still goes to stdout; a swap not validated in time is withdrawn); 2 a usage error; 130 interrupted (Ctrl-C)
    while it waited for validation (the swap is withdrawn).
    """
    from hotswap.executor.operator.client import Client

    settings = ctx.obj.settings(namespace=namespace)
    client = Client(settings.control, settings.kafka, settings.pipeline)
    if dry_run:
        plan = client.dry_run(file, name, timeout, source_schema=source_schema, avro_schema=avro_schema)
        if as_json:
            typer.echo(plan.model_dump_json(indent=2))
        else:
            render_plan(plan)
        if not plan.valid:
            typer.echo(f"hotswap: rejected: {plan.reason}", err=True)
            raise typer.Exit(1)
        return
    if shadow and (wait or fix is not None):
        raise typer.BadParameter("--shadow runs until `hotswap promote`: it takes neither --wait nor --fix")
    swap = client.submit(
        file,
        name,
        fix=fix,
        source_schema=source_schema,
        avro_schema=avro_schema,
        auto_rollback=auto_rollback,
        shadow=shadow,
    )
    if not as_json:
        typer.echo(swap.id)
    if wait:
        done = client.wait_until_done(swap.id, timeout)
        if not as_json:
            typer.echo(f"completed: {done.from_query} -> {done.to_query}, cut at {iso(done.cut_window_end)}", err=True)
        swap = done
    if as_json:
        typer.echo(swap.model_dump_json(indent=2))


@app.command()
@operator_errors
def replace(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="The query that takes over: a .sql or .py file.")],
    name: Annotated[str | None, typer.Option(help="Query id (default: the file name).")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the swap completes.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait.")] = 600.0,
    source_schema: Annotated[
        str | None, typer.Option(help="The schema this version reads, as Spark DDL (JSON sources).")
    ] = None,
    avro_schema: Annotated[
        Path | None, typer.Option(help="The Avro schema (.avsc) this version reads (Avro sources).")
    ] = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Replace the serving query after it failed for good (a poison row, a bug): the new query takes over
    its input for every window it did not emit, exactly once. Prints the swap id.

    Exit codes: 0 validated and queued (with --wait: completed); 1 the serving query has not failed, rejected,
    failed or timed out, or Redis unreachable (one line on stderr); 2 a usage error; 130 interrupted (Ctrl-C).
    """
    from hotswap.executor.operator.client import Client

    settings = ctx.obj.settings(namespace=namespace)
    client = Client(settings.control, settings.kafka, settings.pipeline)
    swap = client.replace(file, name, source_schema=source_schema, avro_schema=avro_schema)
    typer.echo(swap.id)
    if wait:
        done = client.wait_until_done(swap.id, timeout)
        typer.echo(
            f"completed: {done.to_query} answers windows ending after {iso(done.cut_window_end)}, "
            f"{done.from_query} the ones before",
            err=True,
        )


@app.command()
@operator_errors
def abort(
    ctx: typer.Context,
    swap_id: Annotated[str, typer.Argument(help="The swap id printed by submit.")],
    namespace: NamespaceOpt = None,
) -> None:
    """Abort a swap that has not been cut yet; the running query keeps serving.

    Exit codes: 0 aborted; 1 unknown swap, already cut or ended, or Redis unreachable (one line on stderr); 2 a usage
    error.
    """
    from hotswap.executor.operator.client import Client

    settings = ctx.obj.settings(namespace=namespace)
    record = Client(settings.control, settings.kafka, settings.pipeline).abort(swap_id)
    typer.echo(f"aborted {record.id}")


@app.command()
@operator_errors
def diff(
    ctx: typer.Context,
    swap_id: Annotated[str, typer.Argument(help="The shadow's swap id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    tolerance: Annotated[
        float, typer.Option(help="Relative tolerance for floating-point values (with the same absolute floor).")
    ] = 1e-9,
    namespace: NamespaceOpt = None,
) -> None:
    """Compare a shadow's results with the current version's, window by window, since its start S.

    Exit codes: 0 compared (whatever the differences); 1 not a shadow, not started, or Redis or Kafka unreachable (one
    line on stderr); 2 a usage error.
    """
    from hotswap.executor.operator.client import Client

    settings = ctx.obj.settings(namespace=namespace)
    summary = Client(settings.control, settings.kafka, settings.pipeline).diff(swap_id, tolerance)
    if as_json:
        typer.echo(summary.model_dump_json(indent=2))
    else:
        render_diff(summary)


@app.command()
@operator_errors
def promote(
    ctx: typer.Context,
    swap_id: Annotated[str, typer.Argument(help="The shadow's swap id.")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the swap completes.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait.")] = 600.0,
    namespace: NamespaceOpt = None,
) -> None:
    """Promote a shadow: cut to it at the service graph's next batch, with no deploy (it already runs).

    Exit codes: 0 promoted (with --wait: the swap completed); 1 not a running shadow, the swap failed or timed out, or
    Redis unreachable (one line on stderr); 2 a usage error.
    """
    from hotswap.executor.operator.client import Client

    settings = ctx.obj.settings(namespace=namespace)
    client = Client(settings.control, settings.kafka, settings.pipeline)
    client.promote(swap_id)
    typer.echo(f"promoting {swap_id}: the cut comes at the service graph's next batch")
    if wait:
        done = client.wait_until_done(swap_id, timeout)
        typer.echo(f"completed: {done.from_query} -> {done.to_query}, cut at {iso(done.cut_window_end)}", err=True)


@app.command()
@operator_errors
def rollback(
    ctx: typer.Context,
    swap_id: Annotated[str, typer.Argument(help="The swap to undo.")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the swap back completes.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait with --wait.")] = 600.0,
    namespace: NamespaceOpt = None,
) -> None:
    """Undo a swap: before its cut, abort it; after it, swap back to the previous query at the next boundary.

    Exit codes: 0 aborted or queued (with --wait: the swap back completed); 1 nothing to roll back, the swap back
    failed or timed out, or Redis unreachable (one line on stderr); 2 a usage error.
    """
    from hotswap.contract.journal import SwapPhase
    from hotswap.executor.operator.client import Client

    settings = ctx.obj.settings(namespace=namespace)
    client = Client(settings.control, settings.kafka, settings.pipeline)
    record = client.rollback(swap_id)
    if record.state is SwapPhase.ABORTED:
        typer.echo(f"aborted {record.id} (it had not been cut)")
        return
    typer.echo(f"{record.id}: swap back to {record.to_query}, queued; windows up to its cut keep {swap_id}'s results")
    if wait:
        done = client.wait_until_done(record.id, timeout)
        typer.echo(f"{done.id} completed: {record.to_query} answers windows ending after {iso(done.cut_window_end)}")


@app.command()
@operator_errors
def status(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the status document as JSON.")] = False,
    watch_: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="A live view, redrawn every --interval until Ctrl-C: rates, partitions, the swap in progress with "
            "each phase and progress bars, counts.",
        ),
    ] = False,
    interval: Annotated[float, typer.Option(help="Seconds between redraws with --watch.", min=0.1)] = 0.5,
    namespace: NamespaceOpt = None,
) -> None:
    """The current query, swaps with their phases, the service graph's windows and watermark.

    Exit codes: 0 printed (--watch: ended with Ctrl-C); 1 Redis unreachable (one line on stderr); 2 a usage error.
    """
    from hotswap.executor.operator.client import Client

    settings = ctx.obj.settings(namespace=namespace)
    client = Client(settings.control, settings.kafka, settings.pipeline)
    if watch_:
        from hotswap.executor.operator.watch import watch

        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        watch(client, settings.pipeline, settings.kafka, settings.timeouts, console, interval, stop)
        return
    doc = client.status()
    if as_json:
        typer.echo(doc.model_dump_json(indent=2))
        return
    render_status(doc)


@app.command()
@operator_errors
def acl(
    ctx: typer.Context,
    executor_user: Annotated[str, typer.Option(help="The executor's (and operators') Redis user.")] = "hotswap",
    submitter_user: Annotated[str, typer.Option(help="The Redis user of people who only submit.")] = "hotswap-submit",
    namespace: NamespaceOpt = None,
) -> None:
    """Print the Redis ACL lines of the namespace's two users, for an ACL file (`aclfile`): the
    executor's, with exactly hotswap's commands on the namespace's keys, and a submitter's, who may
    submit, abort, promote and read, but never write the journal, the lease or the routing plans.
    Replace PASSWORD; `ACL SETUSER user ...` takes the same words. Connects to nothing.

    Exit codes: 0 printed; 2 a usage error.
    """
    from hotswap.contract.access import acl_line, executor_rules, submitter_rules

    settings = ctx.obj.settings(namespace=namespace)
    typer.echo(acl_line(executor_user, executor_rules(settings.namespace)))
    typer.echo(acl_line(submitter_user, submitter_rules(settings.namespace)))


@app.command()
@operator_errors
def history(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the history as a JSON list.")] = False,
    limit: Annotated[int | None, typer.Option(help="Only the newest N swaps.", min=1)] = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Past swaps, newest first: each phase's duration, W, the outcome, and a failure's reason and reason code.

    Exit codes: 0 printed; 1 Redis unreachable (one line on stderr); 2 a usage error.
    """
    from hotswap.contract.models import now_ms
    from hotswap.executor.operator.client import Client
    from hotswap.executor.operator.history import history as swap_history

    settings = ctx.obj.settings(namespace=namespace)
    entries = swap_history(Client(settings.control, settings.kafka, settings.pipeline).status(), now_ms(), limit)
    if as_json:
        typer.echo(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return
    render_history(entries)


# -- generate / demo ----------------------------------------------------------------------------
@app.command()
@operator_errors
def generate(
    ctx: typer.Context,
    topic: Annotated[str | None, typer.Option(help="Target topic (default: the source topic).")] = None,
    rate: Annotated[float, typer.Option(help="Events per second.")] = 200.0,
    keys: Annotated[int, typer.Option(help="Number of distinct keys.")] = 10,
    seed: Annotated[int, typer.Option(help="Same seed, same sequence.")] = 42,
    count: Annotated[int | None, typer.Option(help="Stop after N events.")] = None,
    duration: Annotated[float | None, typer.Option(help="Stop after S seconds worth of events.")] = None,
    disorder_ms: Annotated[int, typer.Option(help="Bounded out-of-order event times (ms).")] = 0,
    late_fraction: Annotated[float, typer.Option(help="Fraction of events made late on purpose.")] = 0.0,
    late_by_ms: Annotated[int, typer.Option(help="How far behind a late event is (ms).")] = 300_000,
    start_ts: Annotated[int | None, typer.Option(help="Event time of the first event (epoch ms).")] = None,
    time_scale: Annotated[float, typer.Option(help="Event time runs this much faster than the clock.")] = 1.0,
    profile: Annotated[
        str, typer.Option(help="events: flat {key, value, ts}; orders: nested orders with ISO-8601 created_at.")
    ] = "events",
    encoding: Annotated[
        str,
        typer.Option(
            "--format", help="json, or avro in Confluent's wire format (schemas: examples/events.avsc, orders.avsc)."
        ),
    ] = "json",
    schema_id: Annotated[int, typer.Option(help="The schema id written before each Avro record.")] = 1,
) -> None:
    """Write seeded events to the source topic: the demo's {key, value, ts}, or nested orders; as JSON or Avro.

    Exit codes: 0 sent (or stopped with Ctrl-C); 1 Kafka unreachable (one line on stderr); 2 a usage error.
    """
    from hotswap.executor.tools.generator import Encoding, GeneratorReport, GeneratorSpec, Profile, produce

    settings = ctx.obj.settings()
    spec = GeneratorSpec(
        rate=rate,
        keys=keys,
        seed=seed,
        count=count,
        duration_s=duration,
        disorder_ms=disorder_ms,
        late_fraction=late_fraction,
        late_by_ms=late_by_ms,
        start_ts=start_ts,
        time_scale=time_scale,
        profile=_choice(Profile, profile, "--profile"),
        encoding=_choice(Encoding, encoding, "--format"),
        schema_id=schema_id,
    )
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def show(report: GeneratorReport) -> None:
        typer.echo(f"sent {report.sent} events in {report.elapsed_s:.0f}s, event time {iso(report.last_ts)}", err=True)

    report = produce(settings.kafka, spec, topic or settings.source_topic, stop, show)
    typer.echo(f"sent {report.sent} events ({iso(report.first_ts)} .. {iso(report.last_ts)})")


@app.command()
@operator_errors
def demo(
    ctx: typer.Context,
    duration: Annotated[float, typer.Option(help="Seconds of generated load.")] = 120.0,
    swap_after: Annotated[float, typer.Option(help="Seconds after results start before submitting a swap.")] = 30.0,
    replacement: Annotated[Path, typer.Option(help="Query to swap in.")] = Path("examples/max_per_key_30s.sql"),
    query: Annotated[Path, typer.Option(help="Initial query.")] = Path("examples/count_per_key.sql"),
    keep_stack: Annotated[bool, typer.Option(help="Leave the stack running afterwards.")] = False,
    metrics_port: Annotated[
        int, typer.Option(help="Port of the dashboard and /metrics (any free port if it is taken).")
    ] = 9464,
    attach: Annotated[
        bool,
        typer.Option(
            "--attach",
            help="Start nothing: follow the executor and generator that run elsewhere (compose/docker-compose.yml), "
            "swap, wait for the load to end, and check.",
        ),
    ] = False,
    sink: Annotated[
        str | None,
        typer.Option(help="Where results land: delta:PATH or postgres:TABLE (with --sink-url); default a topic."),
    ] = None,
    sink_url: Annotated[str | None, typer.Option(help="With --sink postgres:TABLE: the database's URL.")] = None,
) -> None:
    """Start everything, stream events, swap the query live, and check the results.

    Exit codes: 0 the swap completed with no missing window and no duplicate result; 1 the check failed or the demo
    could not run (the reason on the console); 2 a usage error.
    """
    from hotswap.executor.operator.demo import run_attached_demo, run_demo

    if attach:
        ok = run_attached_demo(ctx.obj, console, replacement, duration, swap_after)
    else:
        ok = run_demo(
            ctx.obj, console, query, replacement, duration, swap_after, keep_stack, metrics_port, sink, sink_url
        )
    raise typer.Exit(0 if ok else 1)


def _choice(kind: type[E], value: str, flag: str) -> E:
    try:
        return kind(value)
    except ValueError as exc:
        raise ConfigError(f"{flag} {value!r}: use one of {', '.join(str(v) for v in kind)}") from exc


def main() -> None:
    app()
