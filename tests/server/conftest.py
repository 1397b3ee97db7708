"""A real ``sqlsdc serve`` process over a copy of the demo database, for the client tests.

The server listens on a free port (``--port 0`` prints the one chosen) and has one server user,
``analyst`` (password :data:`PASSWORD`), added through the CLI as an admin would. Both are
processes of their own, forked with sqlsdc imported (:mod:`cli_fork`).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import cli_fork
import pytest

PASSWORD = "correct horse 42"
SLOW_SQL = "SELECT COUNT(*) AS n FROM " + ", ".join(f"regions r{i}" for i in range(12))
"""An accepted statement over the public table that runs for about a minute."""


@dataclass
class Running:
    host: str
    port: int
    db: Path
    process: cli_fork.ForkedProcess

    def dsn(self, user: str = "analyst", password: str = PASSWORD, **extra) -> str:
        options = {"host": self.host, "port": self.port, "user": user, "password": password,
                   "dbname": "demo", "sslmode": "disable", **extra}  # fmt: skip
        return " ".join(f"{k}='{v}'" for k, v in options.items())


def add_server_user(db: Path, name: str = "analyst", password: str = PASSWORD) -> None:
    cli_fork.run(["server-user", "add", db, name, "--password-stdin"], input=password + "\n",
                 check=True)  # fmt: skip


def start_server(db: Path, *options: str) -> Running:
    process = cli_fork.popen(
        ["serve", db, "--port", "0", *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    line = process.stdout.readline().strip()
    if not line:
        process.kill()
        raise AssertionError(f"the server did not start: {process.stderr.read()}")
    host, port = line.rsplit(":", 1)
    return Running(host, int(port), db, process)


def stop_server(running: Running) -> None:
    running.process.terminate()
    try:
        running.process.wait(10)
    except subprocess.TimeoutExpired:
        running.process.kill()


@pytest.fixture(scope="module")
def server_db(pristine_demo_db, tmp_path_factory, copy_database) -> Path:
    db = copy_database(pristine_demo_db, tmp_path_factory.mktemp("server"))
    add_server_user(db)
    return db


@pytest.fixture(scope="module")
def dp_server(ckm_db, tmp_path_factory, copy_database):
    """A server on the demo as shipped: persons under the cell key method, benefits under
    differential privacy."""
    db = copy_database(ckm_db, tmp_path_factory.mktemp("dp_server"))
    add_server_user(db)
    running = start_server(db, "--insecure")
    yield running
    stop_server(running)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .sign(key, hashes.SHA256()))  # fmt: skip
    folder = tmp_path_factory.mktemp("tls")
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))  # fmt: skip
    return folder / "cert.pem", folder / "key.pem"


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False
