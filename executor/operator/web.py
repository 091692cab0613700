"""The executor's HTTP endpoint (`hotswap run --metrics-port`): Prometheus metrics on `/metrics`,
the dashboard on `/` (its live part on `/fragment`), and `/api/status` (the status document and
the history as JSON). Served from a thread of the executor's process, by the standard library's
HTTP server: nothing to install, nothing to build.
"""

from __future__ import annotations

import hmac
import json
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import redis
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hotswap.contract.errors import ConfigError
from hotswap.contract.names import Names
from hotswap.contract.settings import ControlSettings, KafkaSettings, OperatorSettings, PipelineSettings
from hotswap.executor.control.controller import Executor
from hotswap.executor.operator.client import Client, redis_client
from hotswap.executor.operator.dashboard import fragment, page
from hotswap.executor.operator.history import history
from hotswap.executor.operator.metrics import LeaseCounts, QueryProgress, metrics_registry
from hotswap.executor.operator.observe import KafkaPositions, Rates, RateWindow, Snapshot, take_snapshot

log = structlog.get_logger(__name__)

SNAPSHOT_MAX_AGE_S = 0.5  # scrapes and page refreshes within this share one read of Redis


class Observer:
    """Snapshots of the control state, shared by the pages and the metrics, with the rates between
    the last two (kept only to compute rates: the truth stays in Redis)."""

    def __init__(self, client: Client, kafka: KafkaPositions | None = None) -> None:
        self._client = client
        self._kafka = kafka
        self._lock = threading.Lock()
        self._latest: Snapshot | None = None
        self._window = RateWindow()
        self._rates = Rates()

    def snapshot(self) -> Snapshot:
        with self._lock:
            latest = self._latest
            if latest is not None and time.monotonic() - latest.taken_s < SNAPSHOT_MAX_AGE_S:
                return latest
            fresh = take_snapshot(self._client, self._kafka)
            self._rates = self._window.add(fresh)
            self._latest = fresh
            return fresh

    def rates(self) -> Rates:
        with self._lock:
            return self._rates


LOOPBACK = ("127.0.0.1", "localhost", "::1")
ALL_INTERFACES = ("", "0.0.0.0", "::")  # noqa: S104 - names of the wildcard bind, compared, never bound here
TOKEN_COOKIE = "hotswap_token"  # noqa: S105 - the cookie's name, not a secret
OPEN_PATHS = ("/metrics", "/healthz")  # Prometheus scrapes without credentials, by convention


class Gate:
    """Who may read the endpoint. It answers only requests whose `Host` names the address it serves,
    so a page in the operator's browser cannot read it through a rebound DNS name; bound beyond
    loopback, it also wants the token (`metrics_token`, or one generated at start), except on
    `/metrics` and `/healthz`. The token comes as `Authorization: Bearer`, as `?token=` (the page
    then keeps it in a cookie), or in that cookie."""

    def __init__(self, host: str, token: str | None) -> None:
        self._host = host
        self.token = token

    @staticmethod
    def for_settings(operator: OperatorSettings) -> Gate:
        host = operator.metrics_host
        if host in LOOPBACK:
            return Gate(host, None)
        given = operator.metrics_token
        return Gate(host, given.get_secret_value() if given is not None else secrets.token_urlsafe(24))

    def host_allowed(self, header: str | None, port: int) -> bool:
        if self._host in ALL_INTERFACES:
            return True  # every address of the machine: the token guards it
        if header is None:
            return False
        name, _, given_port = header.strip().lower().rpartition(":")
        if not name or not given_port.isdigit() or int(given_port) != port:
            return False
        name = name.strip("[]")
        served = LOOPBACK if self._host in LOOPBACK else (self._host.lower(),)
        return name in served

    def token_allowed(self, path: str, query: str, authorization: str | None, cookie: str | None) -> bool:
        if self.token is None or path in OPEN_PATHS:
            return True
        offered = [parse_qs(query).get("token", [""])[0]]
        if authorization and authorization.startswith("Bearer "):
            offered.append(authorization.removeprefix("Bearer ").strip())
        if cookie:
            jar = SimpleCookie()
            jar.load(cookie)
            if TOKEN_COOKIE in jar:
                offered.append(jar[TOKEN_COOKIE].value)
        return any(hmac.compare_digest(candidate.encode(), self.token.encode()) for candidate in offered if candidate)


class MonitorServer:
    """The endpoint's server thread; `url` says where it listens once started."""

    def __init__(
        self,
        operator: OperatorSettings,
        names: Names,
        client: Client,
        *,
        lease: LeaseCounts | None = None,
        queries: Callable[[], Iterable[QueryProgress]] | None = None,
        kafka: KafkaPositions | None = None,
    ) -> None:
        assert operator.metrics_port is not None
        self._operator = operator
        self.gate = Gate.for_settings(operator)
        self._kafka = kafka
        self.observer = Observer(client, kafka)
        self.registry, self._durations = metrics_registry(
            self.observer.snapshot, lease, queries, names.owned_topic_prefix
        )
        try:
            self._server = ThreadingHTTPServer((operator.metrics_host, operator.metrics_port), self._handler())
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {operator.metrics_host}:{operator.metrics_port} ({exc.strerror}); "
                "choose another --metrics-port (0 takes any free port)"
            ) from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="hotswap-web", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._operator.metrics_host
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else host  # noqa: S104 - only how the address is shown
        return f"http://{shown}:{self.port}/"

    def start(self) -> MonitorServer:
        self._thread.start()
        if self._durations is not None:
            self._durations.start()
        log.info("dashboard and metrics served", dashboard=self.url, metrics=f"{self.url}metrics")
        if self.gate.token is not None and self._operator.metrics_token is None:
            # Printed once, on the terminal only: never in the structured log.
            print(f"hotswap: dashboard token (open {self.url}?token=<it>): {self.gate.token}", file=sys.stderr)
        return self

    def stop(self) -> None:
        if self._durations is not None:
            self._durations.stop()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        if self._kafka is not None:
            self._kafka.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                gate = server.gate
                if not gate.host_allowed(self.headers.get("Host"), server.port):
                    self._send(421, "text/plain; charset=utf-8", b"this endpoint answers only to its own address\n")
                    return
                if not gate.token_allowed(path, query, self.headers.get("Authorization"), self.headers.get("Cookie")):
                    self._send(401, "text/plain; charset=utf-8", b"a token is needed: open the page with ?token=\n")
                    return
                try:
                    route = server._route(path)
                except (redis.RedisError, OSError) as exc:
                    self._send(503, "text/plain; charset=utf-8", f"control state unreachable: {exc}\n".encode())
                    return
                if route is None:
                    self._send(404, "text/plain; charset=utf-8", b"not found\n")
                    return
                self._send(200, *route, token=gate.token if "token=" in query else None)

            def _send(self, code: int, content_type: str, body: bytes, token: str | None = None) -> None:
                self.send_response(code)
                if token is not None:  # kept by the browser for the page's own refreshes
                    self.send_header("Set-Cookie", f"{TOKEN_COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/")
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("http request", request=format % args)

        return Handler

    def _route(self, path: str) -> tuple[str, bytes] | None:
        html = "text/html; charset=utf-8"
        if path == "/metrics":
            return CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path in ("/", "/index.html"):
            snap = self.observer.snapshot()
            return html, page(snap, self.observer.rates()).encode()
        if path == "/fragment":
            snap = self.observer.snapshot()
            return html, fragment(snap, self.observer.rates()).encode()
        if path == "/api/status":
            snap = self.observer.snapshot()
            document = {
                "status": snap.status.model_dump(mode="json"),
                "history": [h.model_dump(mode="json") for h in history(snap.status, snap.at_ms)],
                "counters": snap.counters,
            }
            return "application/json", json.dumps(document).encode()
        if path == "/healthz":
            return "text/plain; charset=utf-8", b"ok\n"
        return None


def spark_queries(executor: Executor) -> Callable[[], Iterable[QueryProgress]]:
    """The executor's active streaming queries, for the micro-batch durations. Each graph runs on a
    session of its own (execution_graph/confinement.py), so no one session lists them all."""
    return lambda: [query for query in executor.spark_queries() if query.isActive]


def start_monitor(
    executor: Executor,
    *,
    operator: OperatorSettings,
    control: ControlSettings,
    kafka: KafkaSettings,
    pipeline: PipelineSettings,
) -> MonitorServer:
    """The endpoint of an executor about to run: its metrics, its dashboard."""
    return MonitorServer(
        operator,
        pipeline.names,
        Client(control, kafka, pipeline, redis_client(control)),
        lease=executor.lease,
        queries=spark_queries(executor),
        kafka=KafkaPositions(kafka, pipeline.sink.target if pipeline.sink.is_kafka else None),
    ).start()
