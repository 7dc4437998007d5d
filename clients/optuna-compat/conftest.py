"""Fixtures: a live `augur serve --optuna-grpc-listen` ($AUGUR_BIN, or target/debug/augur)
on free loopback ports with an admin token, against $AUGUR_TEST_DATABASE_URL (a PostgreSQL
database made for this run by scripts/optuna-grpc-test.sh) or a fresh SQLite file; tokens of
each role made through Augur's own API; Optuna's own `GrpcStorageProxy` pointed at it.

Nothing is mocked: Optuna talks gRPC to the real server, the tests HTTP to its REST API.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import grpc
import pytest
from optuna.storages import GrpcStorageProxy
from optuna.storages._grpc.auto_generated import api_pb2_grpc
from optuna.storages._grpc.client import GrpcClientCache

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`augur serve` with Optuna's gRPC storage on a second loopback port; with an admin
    token unless `open` (then no token at all: the server is open on loopback)."""

    def __init__(self, database_url: str, log_path: Path, open: bool = False,
                 admin: Optional[str] = None) -> None:
        self.database_url = database_url
        self.log_path = log_path
        self.admin = None if open else admin or "optuna-admin-" + secrets.token_hex(8)
        self.port = free_port()
        self.grpc_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> "Server":
        binary = os.environ.get("AUGUR_BIN") or str(REPO / "target" / "debug" / "augur")
        if not Path(binary).exists():
            pytest.exit(f"no augur binary at {binary}: build it or set AUGUR_BIN", returncode=2)
        args: List[str] = [binary, "serve", "--database-url", self.database_url,
                           "--listen", f"127.0.0.1:{self.port}",
                           "--optuna-grpc-listen", f"127.0.0.1:{self.grpc_port}"]
        if self.admin:
            args += ["--token", self.admin]
        env = dict(os.environ, AUGUR_LOG=os.environ.get("AUGUR_LOG", "warn"))
        env.pop("AUGUR_TOKEN", None)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"augur serve exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
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

    def call(self, method: str, path: str, token: Optional[str], body: Any = None) -> Tuple[int, Any]:
        """Augur's own REST API, as a plain HTTP client sees it."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                text = r.read()
                return r.status, json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")


class _Bearer(grpc.UnaryUnaryClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        metadata = tuple(details.metadata or ()) + self._metadata
        return continuation(details._replace(metadata=metadata), request)


class TokenStorageProxy(GrpcStorageProxy):
    """Optuna's GrpcStorageProxy, sending an Augur token with each call: the README's
    snippet for servers with tokens. Picklable (multiprocessing) as its parent is."""

    def __init__(self, *, host: str, port: int, token: str) -> None:
        self._token = token
        super().__init__(host=host, port=port)

    def _setup(self) -> None:
        super()._setup()
        self._channel = grpc.intercept_channel(self._channel, _Bearer(self._token))
        self._stub = api_pb2_grpc.StorageServiceStub(self._channel)
        self._cache = GrpcClientCache(self._stub)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("augur")
    url = os.environ.get("AUGUR_TEST_DATABASE_URL") or f"sqlite://{tmp / 'optuna.db'}"
    srv = Server(url, tmp / "serve.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def replica(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A second `augur serve` on the same database: another replica."""
    tmp = tmp_path_factory.mktemp("augur-replica")
    srv = Server(server.database_url, tmp / "serve.log", admin=server.admin).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """An open server (loopback, no token) on its own SQLite file: unchanged Optuna code."""
    tmp = tmp_path_factory.mktemp("augur-open")
    srv = Server(f"sqlite://{tmp / 'open.db'}", tmp / "serve.log", open=True).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def tokens(server: Server) -> Dict[str, str]:
    """A token of each role, made by the admin through Augur's API."""
    out = {"admin": server.admin}
    for role in ["reader", "writer"]:
        status, body = server.call("POST", "/v1/tokens", server.admin,
                                   {"name": f"optuna-{role}-{uuid.uuid4().hex[:6]}",
                                    "role": role})
        assert status == 201, body
        out[role] = body["token"]
    return out


@pytest.fixture
def storage(server: Server, tokens: Dict[str, str]) -> TokenStorageProxy:
    """The writer's storage: what a user's Optuna code gets."""
    return TokenStorageProxy(host="127.0.0.1", port=server.grpc_port, token=tokens["writer"])


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
