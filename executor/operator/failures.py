"""How operator commands fail: one line on stderr and exit status 1, never a traceback, for every
failure the operator can act on."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import redis
import typer

from hotswap.contract.errors import HotswapError
from hotswap.executor.errors import Interrupted

P = ParamSpec("P")
R = TypeVar("R")


def operator_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Prints expected failures as one line on stderr and exits 1, instead of a traceback."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except Interrupted as exc:
            typer.echo(f"hotswap: {exc}", err=True)
            raise typer.Exit(130) from exc
        except KeyboardInterrupt as exc:
            typer.echo("hotswap: interrupted", err=True)
            raise typer.Exit(130) from exc
        except HotswapError as exc:
            typer.echo(f"hotswap: {exc}", err=True)
            raise typer.Exit(1) from exc
        except redis.RedisError as exc:
            typer.echo(f"hotswap: cannot reach Redis ({exc}); is the stack up (`hotswap stack up`)?", err=True)
            raise typer.Exit(1) from exc
        except Exception as exc:
            # kafka-python is imported only by the commands that talk to Kafka (importing it is a
            # good part of a light command's run time), and a KafkaError can only come from them.
            kafka_errors = sys.modules.get("kafka.errors")
            if kafka_errors is None or not isinstance(exc, kafka_errors.KafkaError):
                raise
            typer.echo(f"hotswap: Kafka error ({exc}); is the stack up (`hotswap stack up`)?", err=True)
            raise typer.Exit(1) from exc

    return wrapper
