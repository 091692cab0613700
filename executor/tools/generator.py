"""The generator source: seeded, reproducible JSON events for demos and tests.

Event i has event time start_ts + i * time_scale * 1000 / rate, minus a bounded random disorder;
a fraction of events is made late on purpose. The sequence depends only on the spec (same seed,
same events); the wall clock only paces sending at `rate` events per second.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kafka import KafkaProducer

from hotswap.contract.errors import ConfigError
from hotswap.contract.models import now_ms
from hotswap.contract.settings import Settings


@dataclass(frozen=True)
class GeneratorSpec:
    rate: float = 200.0
    keys: int = 10
    seed: int = 42
    count: int | None = None
    duration_s: float | None = None
    disorder_ms: int = 0
    late_fraction: float = 0.0
    late_by_ms: int = 300_000
    start_ts: int | None = None
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ConfigError("--rate must be positive")
        if self.keys < 1:
            raise ConfigError("--keys must be at least 1")
        if not 0.0 <= self.late_fraction <= 1.0:
            raise ConfigError("--late-fraction must be between 0 and 1")
        if self.disorder_ms < 0 or self.late_by_ms < 0:
            raise ConfigError("--disorder-ms and --late-by-ms cannot be negative")
        if self.time_scale <= 0:
            raise ConfigError("--time-scale must be positive")

    @property
    def limit(self) -> int | None:
        """How many events to send: --count, or --duration worth at --rate, or no limit."""
        if self.count is not None:
            return self.count
        if self.duration_s is not None:
            return int(self.duration_s * self.rate)
        return None


@dataclass(frozen=True)
class Event:
    key: str
    value: float
    ts: int

    def to_json(self) -> bytes:
        return json.dumps({"key": self.key, "value": self.value, "ts": self.ts}).encode()


def events(spec: GeneratorSpec, start_ts: int) -> Iterator[Event]:
    rng = random.Random(spec.seed)
    step_ms = spec.time_scale * 1000.0 / spec.rate
    i = 0
    while spec.limit is None or i < spec.limit:
        ts = start_ts + int(i * step_ms)
        if spec.disorder_ms:
            ts -= rng.randint(0, spec.disorder_ms)
        if spec.late_fraction and rng.random() < spec.late_fraction:
            ts -= spec.late_by_ms
        yield Event(key=f"k{rng.randrange(spec.keys)}", value=round(rng.uniform(0, 100), 3), ts=ts)
        i += 1


@dataclass(frozen=True)
class GeneratorReport:
    sent: int
    first_ts: int | None
    last_ts: int | None
    elapsed_s: float


def produce(
    settings: Settings,
    spec: GeneratorSpec,
    topic: str,
    stop: threading.Event | None = None,
    on_progress: Callable[[GeneratorReport], None] | None = None,
    progress_every_s: float = 5.0,
) -> GeneratorReport:
    """Send events to `topic`, paced at spec.rate; returns what was sent (stops early on `stop`)."""
    start_ts = spec.start_ts if spec.start_ts is not None else now_ms()
    producer = KafkaProducer(**settings.kafka_python_config(), acks="all", linger_ms=5)
    began = time.monotonic()
    next_report = began + progress_every_s
    sent = 0
    first_ts: int | None = None
    last_ts: int | None = None
    try:
        for event in events(spec, start_ts):
            if stop is not None and stop.is_set():
                break
            first_ts = event.ts if first_ts is None else first_ts
            last_ts = event.ts
            producer.send(topic, key=event.key.encode(), value=event.to_json())
            sent += 1
            due = began + sent / spec.rate
            now = time.monotonic()
            if due > now:
                if stop is not None:
                    stop.wait(due - now)
                else:
                    time.sleep(due - now)
            if on_progress is not None and now >= next_report:
                next_report = now + progress_every_s
                on_progress(GeneratorReport(sent, first_ts, last_ts, now - began))
    finally:
        producer.flush(timeout=30)
        producer.close(timeout=10)
    return GeneratorReport(sent, first_ts, last_ts, time.monotonic() - began)
