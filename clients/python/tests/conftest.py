"""Fixtures: a live `augur serve` (the debug binary, or $AUGUR_BIN) on a free loopback port,
against $AUGUR_TEST_DATABASE_URL (a PostgreSQL database made for this run by
scripts/python-client-test.sh) or a fresh SQLite file; clients of it; unique study specs.

Nothing of Augur is mocked. The only stand-in is `faults.FaultProxy`, an HTTP proxy in front
of the real server that can answer 503/429 or drop connections, for the retry tests.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import httpx
import pytest

import augur

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def augur_bin() -> str:
    path = os.environ.get("AUGUR_BIN") or str(REPO / "target" / "debug" / "augur")
    if not Path(path).exists():
        pytest.exit(f"no augur binary at {path}: run `cargo build` or set AUGUR_BIN", returncode=2)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """An `augur serve` process on a loopback port."""

    def __init__(self, database_url: str, log_path: Path, token: Optional[str] = None,
                 extra: Optional[List[str]] = None) -> None:
        self.database_url = database_url
        self.log_path = log_path
        self.token = token
        self.extra = extra or []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> "Server":
        args = [augur_bin(), "serve", "--database-url", self.database_url,
                "--listen", f"127.0.0.1:{self.port}", *self.extra]
        if self.token:
            args += ["--token", self.token]
        env = dict(os.environ, AUGUR_LOG=os.environ.get("AUGUR_LOG", "warn"))
        env.pop("AUGUR_TOKEN", None)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"augur serve exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"augur serve did not come up: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def database_url(tmp: Path, name: str) -> str:
    url = os.environ.get("AUGUR_TEST_DATABASE_URL")
    if url:
        return url
    return f"sqlite://{tmp / (name + '.db')}"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server every test shares (each test makes its own studies)."""
    tmp = tmp_path_factory.mktemp("augur")
    srv = Server(database_url(tmp, "main"), tmp / "serve.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def backend() -> str:
    return "postgres" if os.environ.get("AUGUR_TEST_DATABASE_URL") else "sqlite"


@pytest.fixture
def client(server: Server) -> Iterator[augur.Client]:
    with augur.Client(server.url) as c:
        yield c


@pytest.fixture
def make_spec() -> Callable[..., Dict[str, Any]]:
    """A small valid study spec with a unique name; keyword arguments override fields."""

    def make(**overrides: Any) -> Dict[str, Any]:
        spec: Dict[str, Any] = {
            "name": f"py-{uuid.uuid4().hex[:10]}",
            "algorithm": "random",
            "metrics": [{"id": "loss", "goal": "minimize"}],
            "parameters": [
                {"id": "lr", "type": "double", "min": 1e-4, "max": 1.0, "scale": "log"},
                {"id": "depth", "type": "integer", "min": 1, "max": 6},
                {"id": "opt", "type": "categorical", "values": ["sgd", "adam"]},
            ],
            "max_trials": 20,
            "parallel_trials": 2,
            "seed": 1,
        }
        spec.update(overrides)
        return spec

    return make


def unique_name(prefix: str = "py") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
