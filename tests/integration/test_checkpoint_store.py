"""Checkpoints on an S3 API that refuses them: `hotswap run` says so in one line and starts nothing.

(A swap with its checkpoints on s3proxy is the cluster test's, test_cluster.py.)"""

from __future__ import annotations

import time

import pytest
import redis

from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from tests.integration.harness import changed, run_cli
from tests.integration.s3proxy import ACCESS_KEY, SECRET_KEY, S3Proxy, free_port
from tests.integration.scenarios import COUNT_10S

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("bucket", "secret", "endpoint_down"),
    [("refusing", "not-the-secret", False), ("never-made", SECRET_KEY, False), ("unreached", SECRET_KEY, True)],
    ids=["wrong-secret-key", "no-such-bucket", "endpoint-refuses-connections"],
)
def test_a_checkpoint_root_the_store_refuses_stops_run_in_one_line_before_anything_starts(
    settings: Settings, control: redis.Redis, s3proxy: S3Proxy, bucket: str, secret: str, endpoint_down: bool
) -> None:
    if bucket == "refusing":
        s3proxy.bucket(bucket)
    # A port nothing listens on: every connection is refused.
    endpoint = f"http://127.0.0.1:{free_port()}" if endpoint_down else s3proxy.endpoint
    root = f"s3a://{bucket}/checkpoints"
    store = changed(
        settings, checkpoint_root=root, s3_endpoint=endpoint, s3_access_key=ACCESS_KEY, s3_secret_key=secret
    )
    began = time.monotonic()
    result = run_cli(store, "run", "--query", str(COUNT_10S))
    assert result.returncode == 1, result.stderr[-2000:]
    if endpoint_down:
        # Not a speed target: Hadoop's default retries kept the operator waiting 112 s; the probe's own
        # client says it in about 10 s here, the Spark session's start included.
        assert time.monotonic() - began < 60, "the probe waited out the S3 client's retries"
    said = result.stderr.strip().splitlines()[-1]
    assert said.startswith(f"hotswap: the checkpoint root {root}/{settings.namespace} cannot be reached ("), said
    assert said.endswith("and that the bucket exists")
    assert "Traceback" not in result.stderr
    assert secret not in result.stderr + result.stdout  # the key is never printed
    assert not control.exists(Keys(settings.namespace).namespace_record)  # nothing started
