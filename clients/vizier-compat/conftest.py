"""Fixtures: a live `augur serve` ($AUGUR_BIN, or target/debug/augur) on a free loopback
port with an admin token, against $AUGUR_TEST_DATABASE_URL (a PostgreSQL database made for
this run by scripts/vizier-sdk-test.sh) or a fresh SQLite file; tokens of each role made
through Augur's own API; the SDK pointed at the server with only its documented settings.

Nothing is mocked: the SDK talks HTTP (its REST transport) to the real server.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from live_server import Server as LiveServer, unique  # noqa: E402,F401

PROJECT, LOCATION = "demo-project", "us-central1"


class Server(LiveServer):
    """`augur serve` on a loopback port, with an admin token."""

    def __init__(self, database_url: str, log_path: Path) -> None:
        super().__init__(database_url, log_path, prefix="vizier")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("augur")
    url = os.environ.get("AUGUR_TEST_DATABASE_URL") or f"sqlite://{tmp / 'vizier.db'}"
    srv = Server(url, tmp / "serve.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def tokens(server: Server) -> Dict[str, str]:
    """Two tokens of each role, made by the admin through Augur's API."""
    return server.role_tokens("vizier", ["reader", "reader2", "writer", "writer2"])


def credentials(token: str) -> Any:
    """What a Vertex user passes: OAuth credentials holding a bearer token."""
    import google.oauth2.credentials

    return google.oauth2.credentials.Credentials(token=token)


@pytest.fixture
def sdk(server: Server, tokens: Dict[str, str]) -> Iterator[Any]:
    """`aiplatform`, initialised as a Vertex user would, but for the endpoint and token."""
    from google.cloud import aiplatform

    aiplatform.init(project=PROJECT, location=LOCATION, api_endpoint=server.url,
                    api_transport="rest", credentials=credentials(tokens["writer"]))
    yield aiplatform


def vizier_client(server: Server, token: str, version: str = "v1") -> Any:
    """The generated client of `version`, over REST, at the server."""
    if version == "v1":
        from google.cloud import aiplatform_v1 as api
    else:
        from google.cloud import aiplatform_v1beta1 as api
    return api.VizierServiceClient(transport="rest", credentials=credentials(token),
                                   client_options={"api_endpoint": server.url})
