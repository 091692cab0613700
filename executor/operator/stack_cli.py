"""`hotswap stack`: the embedded Kafka broker and Redis server for development and tests."""

from __future__ import annotations

from typing import Annotated

import typer

from hotswap.executor.operator.failures import operator_errors
from hotswap.executor.operator.render import print_stack

stack_app = typer.Typer(
    help="The embedded Kafka broker and Redis server.\n\nExit codes: 0 done; 1 a failure named in one line on stderr "
    "(a service that did not start, a missing tool or jar); 2 a usage error.",
    no_args_is_help=True,
)


@stack_app.command("up")
@operator_errors
def stack_up(
    ctx: typer.Context,
    postgres: Annotated[
        bool | None,
        typer.Option(
            "--postgres",
            help="Also start PostgreSQL on 127.0.0.1:5433 (HOTSWAP_POSTGRES_PORT), for --sink postgres:TABLE.",
        ),
    ] = None,
) -> None:
    """Start Kafka (KRaft) and Redis under .hotswap/, unless they are configured as external."""
    from hotswap.executor.stack import EmbeddedStack

    settings = ctx.obj.settings(stack_postgres=postgres)
    print_stack(settings.stack, EmbeddedStack(settings.stack, settings.kafka).up())


@stack_app.command("fetch")
@operator_errors
def stack_fetch(
    ctx: typer.Context,
    object_store: Annotated[
        bool,
        typer.Option(
            "--object-store",
            help="Also fetch Hadoop's S3 client (hadoop-aws and the AWS SDK, about 690 MB), which a checkpoint "
            "root on s3a:// needs; fetched anyway when checkpoint_root is one.",
        ),
    ] = False,
) -> None:
    """Fetch the embedded broker's and Spark's Kafka connector jars with Maven, and dump Spark's class-data
    archive (once; later calls are instant).

    `run` uses the connector's jars when they are there, so a copy of the jars directory (HOTSWAP_JARS_DIR)
    lets an offline machine run; without them Spark downloads the connector itself. A driver that finds the
    archive starts its session in about 5 s instead of 8 (docs/performance.md)."""
    from hotswap.executor.control.spark_session import archive_classes
    from hotswap.executor.stack import EmbeddedStack
    from hotswap.executor.stack.jars import fetch_object_store_jars

    settings = ctx.obj.settings()
    stack = EmbeddedStack(settings.stack, settings.kafka)
    typer.echo(f"kafka broker jars: {stack.kafka_jars()}")
    connector = stack.spark_connector_jars()
    typer.echo(f"spark connector jars: {len(connector)} in {connector[0].parent}")
    if object_store or settings.spark.object_store:
        s3 = fetch_object_store_jars(settings.jar_cache)
        typer.echo(f"hadoop s3 client jars: {len(s3)} in {s3[0].parent}")
    archive = archive_classes(settings.spark)
    typer.echo(f"spark class-data archive: {archive or 'none (drivers start without one)'}")


@stack_app.command("down")
@operator_errors
def stack_down(ctx: typer.Context) -> None:
    """Stop the processes `stack up` started (and nothing else)."""
    from hotswap.executor.stack import EmbeddedStack

    settings = ctx.obj.settings()
    stopped = EmbeddedStack(settings.stack, settings.kafka).down()
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing to stop")


@stack_app.command("status")
@operator_errors
def stack_status(ctx: typer.Context) -> None:
    """Addresses, pids and health of Kafka and Redis."""
    from hotswap.executor.stack import EmbeddedStack

    settings = ctx.obj.settings()
    print_stack(settings.stack, EmbeddedStack(settings.stack, settings.kafka).status())
