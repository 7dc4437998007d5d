"""Fixtures: a live `augur serve --optuna-grpc-listen` ($AUGUR_BIN, or target/debug/augur)
on free loopback ports with an admin token, against $AUGUR_TEST_DATABASE_URL (a PostgreSQL
database made for this run by scripts/optuna-grpc-test.sh) or a fresh SQLite file; tokens of
each role made through Augur's own API; Optuna's own `GrpcStorageProxy` pointed at it.

Nothing is mocked: Optuna talks gRPC to the real server, the tests HTTP to its REST API.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterator

import grpc
import pytest
from optuna.storages import GrpcStorageProxy
from optuna.storages._grpc.auto_generated import api_pb2_grpc
from optuna.storages._grpc.client import GrpcClientCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from live_server import Server as LiveServer, free_port, unique  # noqa: E402,F401


class Server(LiveServer):
    """`augur serve` with Optuna's gRPC storage on a second loopback port."""

    def __init__(self, database_url: str, log_path: Path, **options: Any) -> None:
        self.grpc_port = free_port()
        super().__init__(database_url, log_path, prefix="optuna",
                         extra_args=["--optuna-grpc-listen", f"127.0.0.1:{self.grpc_port}"],
                         **options)


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
    return server.role_tokens("optuna", ["reader", "writer"])


@pytest.fixture
def storage(server: Server, tokens: Dict[str, str]) -> TokenStorageProxy:
    """The writer's storage: what a user's Optuna code gets."""
    return TokenStorageProxy(host="127.0.0.1", port=server.grpc_port, token=tokens["writer"])
