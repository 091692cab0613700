"""The executor's lease: one holder at a time, kept by renewal, taken over after its TTL or at once
from a provably dead holder, and `--lease-wait 0` refusing at once.

Waits for a held lease run on a ManualClock (no real time passes). The lease's expiry is Redis's
own (PX), which fakeredis measures in real time, so the two tests that need a TTL to pass or a
heartbeat to run use TTLs of a fraction of a second.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator

import fakeredis
import pytest

from hotswap.contract.errors import LeaseLost
from hotswap.contract.fence import Fence
from hotswap.contract.journal import Journal, SwapPhase, SwapRecord
from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from hotswap.executor.control.lease import Lease, process_space
from hotswap.executor.errors import LeaseHeld
from tests.component.fakes import ManualClock
from tests.conftest import wait_until

pytestmark = pytest.mark.component

KEYS = Keys("component")
# An executor on another host: never provably dead, so only its TTL frees the lease.
ELSEWHERE = "elsewhere:4242:0badf00d:another-space"


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture
def first(client: fakeredis.FakeRedis) -> Iterator[Lease]:
    """An executor holding the lease, its heartbeat running."""
    lease = Lease(client, KEYS.lease)
    lease.acquire()
    yield lease
    lease.release()


def holder(client: fakeredis.FakeRedis) -> str | None:
    raw = client.get(KEYS.lease)
    return raw.decode() if isinstance(raw, bytes) else raw


def exited_pid() -> int:
    """The pid of a process of ours that has exited and been reaped."""
    with subprocess.Popen(["true"]) as child:
        child.wait()
    return child.pid


def test_a_second_executor_is_refused_while_the_first_holds_the_lease(
    client: fakeredis.FakeRedis, first: Lease
) -> None:
    clock = ManualClock()
    second = Lease(client, KEYS.lease, clock=clock, sleep=clock.sleep)
    started = clock()

    with pytest.raises(LeaseHeld, match=first.token):
        second.acquire(wait_s=20)

    assert 20 <= clock() - started < 21  # it waited its whole --lease-wait, polling
    assert len(clock.slept) >= 2
    assert holder(client) == first.token
    with pytest.raises(LeaseHeld, match=first.token):
        second.wait_until_free(wait_s=20)


def test_lease_wait_zero_refuses_at_once_with_one_line_naming_the_holder(
    client: fakeredis.FakeRedis, first: Lease
) -> None:
    wait_s = Settings(namespace="component", lease_wait="0s").lease_wait.s
    clock = ManualClock()
    second = Lease(client, KEYS.lease, clock=clock, sleep=clock.sleep)

    with pytest.raises(LeaseHeld) as refused:
        second.wait_until_free(wait_s)  # what `hotswap run` checks before starting Spark
    with pytest.raises(LeaseHeld):
        second.acquire(wait_s)

    assert clock.slept == []
    message = str(refused.value)
    assert "\n" not in message
    assert first.token in message
    assert "--lease-wait" in message
    assert holder(client) == first.token


def test_renewal_keeps_the_lease_past_its_ttl(client: fakeredis.FakeRedis) -> None:
    ttl_ms = 240  # renewed every 80 ms
    lease = Lease(client, KEYS.lease, ttl_ms=ttl_ms)
    lease.acquire()
    try:
        lapsed_at = time.monotonic() + ttl_ms / 1000  # when it would have expired without renewal

        def past_ttl_and_still_held() -> bool:
            assert holder(client) == lease.token  # never free, never someone else's, at any poll
            return time.monotonic() > lapsed_at + 0.02

        wait_until(past_ttl_and_still_held, timeout_s=5, what="the lease's first TTL to pass", interval_s=0.01)
        lease.check()
        clock = ManualClock()
        with pytest.raises(LeaseHeld):
            Lease(client, KEYS.lease, clock=clock, sleep=clock.sleep).acquire(wait_s=0)
    finally:
        lease.release()
    assert holder(client) is None


def test_a_lease_that_is_not_renewed_is_taken_over_once_its_ttl_passes(client: fakeredis.FakeRedis) -> None:
    written_at = time.monotonic()
    client.set(KEYS.lease, ELSEWHERE, px=150)  # a holder that stopped renewing (SIGSTOP, a partition)
    clock = ManualClock()
    with pytest.raises(LeaseHeld, match=ELSEWHERE):
        Lease(client, KEYS.lease, clock=clock, sleep=clock.sleep).acquire(wait_s=0)

    # Redis expires the key in real time, so this one waits on the real clock, asking every 10 ms.
    second = Lease(client, KEYS.lease, sleep=lambda _: time.sleep(0.01))
    second.acquire(wait_s=5)
    try:
        assert time.monotonic() - written_at >= 0.14  # it waited for the TTL, it did not steal the lease
        assert holder(client) == second.token
    finally:
        second.release()


def test_a_provably_dead_holder_is_taken_over_at_once(client: fakeredis.FakeRedis) -> None:
    dead = f"{socket.gethostname()}:{exited_pid()}:0badf00d:{process_space()}"
    client.set(KEYS.lease, dead, px=15_000)
    clock = ManualClock()
    second = Lease(client, KEYS.lease, clock=clock, sleep=clock.sleep)

    second.wait_until_free(wait_s=0)
    second.acquire(wait_s=0)
    try:
        assert clock.slept == []
        assert holder(client) == second.token
    finally:
        second.release()


def test_a_live_holder_on_this_host_is_not_taken_over(client: fakeredis.FakeRedis) -> None:
    alive = f"{socket.gethostname()}:{os.getppid()}:0badf00d:{process_space()}"
    client.set(KEYS.lease, alive, px=15_000)
    clock = ManualClock()
    with pytest.raises(LeaseHeld, match=alive):
        Lease(client, KEYS.lease, clock=clock, sleep=clock.sleep).acquire(wait_s=1)
    assert holder(client) == alive


def test_an_executor_whose_lease_was_taken_over_stops_and_cannot_write(client: fakeredis.FakeRedis) -> None:
    client.set(KEYS.namespace_record, "{}")
    stalled = Lease(client, KEYS.lease, ttl_ms=150)
    stalled.acquire()
    journal = Journal(client, KEYS, Fence(KEYS, stalled.token))
    journal.create(SwapRecord(id="s", to_query="b"))
    successor = Lease(client, KEYS.lease)
    # Its lease expired while it stalled, and another executor took it (one write: the stalled
    # heartbeat must not see the key free in between, or it would take it back).
    client.set(KEYS.lease, successor.token, px=15_000)
    try:
        with pytest.raises(LeaseLost, match="lost its lease"):
            journal.advance("s", SwapPhase.VALIDATED)

        def told() -> bool:
            try:
                stalled.check()
            except LeaseLost:
                return True
            return False

        wait_until(told, timeout_s=5, what="the stalled executor's heartbeat to find its lease gone", interval_s=0.01)
        stalled.release()  # its release leaves the successor's lease alone
        assert holder(client) == successor.token
        assert journal.get("s").state is SwapPhase.SUBMITTED
    finally:
        successor.release()
