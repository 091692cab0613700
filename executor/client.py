"""What the CLI does against a running executor, through Redis only: submit, wait, abort, status."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from contract.errors import ConfigError, TimeoutExpired
from contract.journal import Journal, SwapPhase, SwapRecord
from contract.keys import Keys
from contract.models import ExecutorRecord
from contract.records import read_counters, read_current, read_graphs, read_service_state
from contract.settings import Settings
from execution_graph.user_query import load_query_source
from executor.errors import ExecutorError, SubmitRejected, SwapFailed
from executor.waits import start_blocker, waiting_for
from service_sink.progress import read_progress

ABORTABLE = (SwapPhase.SUBMITTED, SwapPhase.VALIDATED, SwapPhase.DEPLOYED)


def redis_client(settings: Settings, retries: int = 40) -> redis.Redis:
    """A client that rides out a Redis restart: by default each command retries with back-off for
    about a minute before it gives up, so a restarted Redis (reloading its append-only file) is
    waited for. One-shot CLI commands pass fewer retries, to fail fast when the stack is down.

    Wrong credentials are not worth retrying (redis-py counts them as connection errors), so
    they are checked once up front.
    """
    probe = redis.Redis.from_url(settings.redis_dsn, socket_timeout=5, socket_connect_timeout=5)
    try:
        probe.ping()
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        raise ConfigError(f"Redis refused the credentials in HOTSWAP_REDIS_URL ({type(exc).__name__})") from exc
    except redis.ConnectionError:
        pass  # down or restarting: the retrying client below waits for it
    finally:
        probe.close()
    return redis.Redis.from_url(
        settings.redis_dsn,
        socket_timeout=10,
        socket_connect_timeout=5,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), retries=retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError],
    )


class Client:
    def __init__(self, settings: Settings, client: redis.Redis | None = None) -> None:
        self.settings = settings
        self._redis = client or redis_client(settings, retries=3)
        self._keys = Keys(settings.namespace)
        self.journal = Journal(self._redis, self._keys)

    def submit(self, path: Path, name: str | None = None, validation_timeout_s: float = 120.0) -> SwapRecord:
        """Queue a swap and return once the executor has validated it; raises SubmitRejected."""
        source = load_query_source(path, name)
        if not self._redis.exists(self._keys.lease):
            raise ExecutorError(
                f"no executor is running on namespace {self.settings.namespace!r}; start one with `hotswap run`"
            )
        swap = self.journal.create(SwapRecord(id=uuid.uuid4().hex[:10], to_query=source.name, source=source))
        record = self.wait_for(swap.id, lambda r: r.state is not SwapPhase.SUBMITTED, validation_timeout_s, "validated")
        if record.state is SwapPhase.REJECTED:
            raise SubmitRejected(f"rejected: {record.error}")
        return record

    def wait_until_done(self, swap_id: str, timeout_s: float) -> SwapRecord:
        record = self.wait_for(swap_id, lambda r: r.state.is_terminal, timeout_s, "completed")
        if record.state is not SwapPhase.COMPLETED:
            raise SwapFailed(f"swap {swap_id} {record.state}: {record.error}")
        return record

    def wait_for(self, swap_id: str, done: Any, timeout_s: float, what: str) -> SwapRecord:
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.journal.get(swap_id)
            if done(record):
                return record
            if time.monotonic() >= deadline:
                raise TimeoutExpired(
                    f"swap {swap_id} was not {what} within {timeout_s:.0f}s (it is {record.state}); "
                    "follow it with `hotswap status`"
                )
            time.sleep(0.3)

    def abort(self, swap_id: str) -> SwapRecord:
        aborted = self.journal.advance(
            swap_id, SwapPhase.ABORTED, error="aborted by operator", when=lambda r: r.state in ABORTABLE
        )
        if aborted is None:
            latest = self.journal.get(swap_id)
            raise ExecutorError(
                f"swap {swap_id} is {latest.state}; only a swap before its cut can be aborted"
                if latest.state.is_past_cut
                else f"swap {swap_id} has already ended ({latest.state})"
            )
        return aborted

    def status(self) -> dict[str, Any]:
        """The status document; its core fields are a contract (README, "Status")."""
        current = read_current(self._redis, self._keys)
        service = read_service_state(self._redis, self._keys)
        counters = read_counters(self._redis, self._keys)
        graphs = read_graphs(self._redis, self._keys)
        lease = self._redis.get(self._keys.lease)
        raw_executor = self._redis.get(self._keys.executor)
        executor = ExecutorRecord.model_validate_json(raw_executor) if raw_executor else None
        swaps = self.journal.all()
        progress = {query_id: read_progress(self._redis, self._keys, query_id) for query_id in graphs}
        blocker = start_blocker(current, graphs, swaps)
        return {
            "namespace": self.settings.namespace,
            "executor": {
                "holder": lease.decode() if isinstance(lease, bytes) else lease,
                "phase": str(executor.phase) if executor and lease else "stopped",
                "since": executor.at if executor else None,
            },
            "current": current.model_dump() if current else None,
            "swaps": [_swap_view(s, waiting_for(s, swaps, service, progress, blocker)) for s in swaps],
            "service": {
                "watermark": service.watermark,
                "last_batch": service.last_batch,
                "partitions": {
                    p: {"window_end": n.window_end, "event_time": n.event_time, "offset": n.offset, "idle": n.idle}
                    for p, n in sorted(service.partitions.items(), key=lambda item: int(item[0]))
                },
            },
            "graphs": {
                query_id: {
                    "state": g.state,
                    "topic": g.topic,
                    "window_ms": g.window_ms,
                    "kind": g.source.kind,
                    "started_at": g.started_at,
                    "retired_at": g.retired_at,
                    "progress": _progress_view(progress[query_id]),
                }
                for query_id, g in graphs.items()
            },
            "late_records": counters.get("late_records", 0),
            "dead_letter_records": counters.get("dead_letter_records", 0),
            "expired_records": counters.get("expired_records", 0),
        }


def _swap_view(swap: SwapRecord, waiting: str | None) -> dict[str, Any]:
    return {
        "id": swap.id,
        "from_query": swap.from_query,
        "to_query": swap.to_query,
        "state": str(swap.state),
        "cut_window_end": swap.cut_window_end,
        "cut_batch": swap.cut_batch,
        "old_window_ms": swap.old_window_ms,
        "new_window_ms": swap.new_window_ms,
        "phases": [{"name": str(p.name), "at": p.at} for p in swap.phases],
        "error": swap.error,
        "waiting_for": waiting,
    }


def _progress_view(progress: Any) -> dict[str, Any] | None:
    if progress is None:
        return None
    return {
        "batch_id": progress.batch_id,
        "watermark": progress.watermark,
        "committed_batch": progress.committed_batch,
        "committed_watermark": progress.committed_watermark,
        "num_input_rows": progress.num_input_rows,
    }
