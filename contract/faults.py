"""Crash points for fault-injection tests.

`crash_point("after:cut")` kills this process with SIGKILL when HOTSWAP_CRASH_AT names that
point, so tests can crash the executor at an exact step of the protocol, the way a power cut or
OOM kill would, and check that a restart resumes correctly. Unset, it does nothing.
"""

from __future__ import annotations

import os
import signal
import sys

CRASH_ENV = "HOTSWAP_CRASH_AT"


def crash_point(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        sys.stderr.write(f"hotswap: crash point {name} reached; killing this process (SIGKILL)\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
