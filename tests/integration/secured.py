"""A secured Kafka broker and Redis server for the security tests, on their own ports.

- Certificates: a throwaway CA and a server certificate for 127.0.0.1, made with `openssl`.
- Kafka: the embedded broker's jars and config, plus a `SASL_SSL` listener (SCRAM-SHA-512). Its
  plaintext listener stays for the broker's own controller traffic and for the fixture, which
  creates the SCRAM users there; hotswap only ever gets the secured address.
- Redis: TLS only (no plaintext port), with ACL users the fixture creates through its admin user,
  append-only with fsync on every write, as hotswap asks of a Redis.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
from kafka import KafkaAdminClient
from kafka.admin import ScramMechanism, UserScramCredentialUpsertion

from hotswap.contract.settings import KafkaSettings, Settings, StackSettings
from hotswap.executor.stack import kafka_answers
from hotswap.executor.stack.jars import kafka_jars
from hotswap.executor.stack.kafka import KafkaBroker, cluster_id
from tests.conftest import wait_until
from tests.integration.harness import JARS

LOCALHOST = "127.0.0.1"
# Below the kernel's ephemeral range (32768-60999), so a client socket never holds one first.
PLAIN_PORT, CONTROLLER_PORT, SECURED_PORT, REDIS_TLS_PORT = 31092, 31093, 31094, 31379
START_TIMEOUT_S = 180


@dataclass(frozen=True)
class Certificates:
    ca: Path  # PEM: what clients trust
    cert: Path  # PEM: the server's certificate, for 127.0.0.1
    key: Path  # PEM: its private key
    keystore: Path  # PKCS12: the key and the certificate chain, for the broker
    keystore_password: str


def make_certificates(directory: Path) -> Certificates:
    """A CA, and a server certificate it signs for IP 127.0.0.1 (both sides check the host)."""
    directory.mkdir(parents=True, exist_ok=True)
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl is not on PATH; install the Debian package openssl (`.ci/run` does it)")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=hotswap test CA",
        "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
        "-out", "server.csr")  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "san.ext", "-out", "server.pem")  # fmt: skip
    password = secrets.token_hex(12)
    run("pkcs12", "-export", "-in", "server.pem", "-inkey", "server.key", "-certfile", "ca.pem", "-name", "kafka",
        "-out", "server.p12", "-passout", f"pass:{password}")  # fmt: skip
    return Certificates(
        directory / "ca.pem", directory / "server.pem", directory / "server.key", directory / "server.p12", password
    )


class SecuredBroker(KafkaBroker):
    """The embedded broker with a third listener, SECURED, on SASL_SSL with SCRAM-SHA-512."""

    def __init__(self, stack: StackSettings, kafka: KafkaSettings, home: Path, certificates: Certificates) -> None:
        super().__init__(stack, kafka, home)
        self.certificates = certificates

    def server_properties(self) -> str:
        plain = f"PLAINTEXT://{LOCALHOST}:{PLAIN_PORT}"
        # Later keys win in a Java properties file: these replace the embedded broker's listeners.
        extra = {
            "listeners": f"{plain},CONTROLLER://{LOCALHOST}:{CONTROLLER_PORT},SECURED://{LOCALHOST}:{SECURED_PORT}",
            "advertised.listeners": f"{plain},SECURED://{LOCALHOST}:{SECURED_PORT}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SECURED:SASL_SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.secured.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "listener.name.secured.ssl.keystore.type": "PKCS12",
            "listener.name.secured.ssl.keystore.location": self.certificates.keystore,
            "listener.name.secured.ssl.keystore.password": self.certificates.keystore_password,
        }
        return super().server_properties() + "".join(f"{key}={value}\n" for key, value in extra.items())


@dataclass(frozen=True)
class SecuredServices:
    certificates: Certificates
    admin_redis: redis.Redis  # the default user, with every right: the fixture's, never hotswap's
    plain_bootstrap: str  # the fixture's way in, to create SCRAM users

    def redis_url(self, user: str, password: str) -> str:
        """A rediss:// URL for an ACL user, trusting the test CA."""
        return (
            f"rediss://{quote(user, safe='')}:{quote(password, safe='')}@{LOCALHOST}:{REDIS_TLS_PORT}/0"
            f"?ssl_ca_certs={self.certificates.ca}"
        )

    def add_kafka_user(self, user: str, password: str) -> None:
        admin = KafkaAdminClient(bootstrap_servers=self.plain_bootstrap, client_id="hotswap-test-admin")
        try:
            errors = admin.alter_user_scram_credentials(
                [UserScramCredentialUpsertion(user, ScramMechanism.SCRAM_SHA_512, password)]
            )
        finally:
            admin.close()
        assert errors.get(user) is None, errors

    def kafka_settings(self, user: str, password: str) -> dict[str, Any]:
        """The settings that send hotswap (both Spark and kafka-python) to the SASL_SSL listener."""
        return {
            "kafka_bootstrap": f"{LOCALHOST}:{SECURED_PORT}",
            "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": "SCRAM-SHA-512",
            "kafka_sasl_username": user,
            "kafka_sasl_password": password,
            "kafka_ssl_cafile": self.certificates.ca,
        }


def _redis_config(directory: Path, certificates: Certificates, admin_password: str) -> Path:
    lines = [
        "port 0",  # TLS only: no plaintext listener at all
        f"tls-port {REDIS_TLS_PORT}",
        f"bind {LOCALHOST}",
        f"tls-cert-file {certificates.cert}",
        f"tls-key-file {certificates.key}",
        f"tls-ca-cert-file {certificates.ca}",
        "tls-auth-clients no",
        "appendonly yes",
        "appendfsync always",
        'save ""',
        f"dir {directory}",
        f"user default on >{admin_password} ~* &* +@all",
    ]
    path = directory / "redis.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def _stop(process: subprocess.Popen[bytes] | None, pid: int | None) -> None:
    if process is not None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 60, "the secured broker to stop")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@contextmanager
def secured_services(home: Path) -> Iterator[SecuredServices]:
    """Start the secured Redis and Kafka under `home`, and stop both at the end."""
    certificates = make_certificates(home / "certs")
    redis_dir = home / "redis"
    redis_dir.mkdir(parents=True, exist_ok=True)
    admin_password = secrets.token_hex(16)
    server = shutil.which("redis-server")
    assert server is not None, "redis-server is not on PATH"
    redis_log = (redis_dir / "redis.log").open("ab")
    redis_process: subprocess.Popen[bytes] | None = subprocess.Popen(
        [server, str(_redis_config(redis_dir, certificates, admin_password))], stdout=redis_log, stderr=redis_log
    )
    broker_pid: int | None = None
    admin_redis = redis.Redis(
        host=LOCALHOST,
        port=REDIS_TLS_PORT,
        password=admin_password,
        ssl=True,
        ssl_ca_certs=str(certificates.ca),
        socket_timeout=5,
        socket_connect_timeout=5,
    )
    try:
        wait_until(lambda: _answers(admin_redis), START_TIMEOUT_S, "the TLS Redis to answer")
        settings = Settings(
            home=home, jars_dir=JARS, kafka_port=PLAIN_PORT, kafka_controller_port=CONTROLLER_PORT, kafka_heap="256m"
        )
        broker = SecuredBroker(settings.stack, settings.kafka, home, certificates)
        broker_pid = broker.start(kafka_jars(settings.jar_cache), cluster_id()).pid
        plain = {"bootstrap_servers": [f"{LOCALHOST}:{PLAIN_PORT}"]}
        wait_until(lambda: kafka_answers(plain), START_TIMEOUT_S, "the secured broker's plaintext listener")
        yield SecuredServices(certificates, admin_redis, f"{LOCALHOST}:{PLAIN_PORT}")
    finally:
        admin_redis.close()
        _stop(redis_process, broker_pid)
        redis_process = None
        redis_log.close()


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
