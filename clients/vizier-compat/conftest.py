"""Fixtures: a live `augur serve` ($AUGUR_BIN, or target/debug/augur) on a free loopback
port with an admin token, against $AUGUR_TEST_DATABASE_URL (a PostgreSQL database made for
this run by scripts/vizier-sdk-test.sh) or a fresh SQLite file; tokens of each role made
through Augur's own API; the SDK pointed at the server with only its documented settings.

Nothing is mocked: the SDK talks HTTP (its REST transport) to the real server.
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
from typing import Any, Dict, Iterator, Optional, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
PROJECT, LOCATION = "demo-project", "us-central1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`augur serve` on a loopback port, with an admin token."""

    def __init__(self, database_url: str, log_path: Path) -> None:
        self.database_url = database_url
        self.log_path = log_path
        self.admin = "vizier-admin-" + secrets.token_hex(8)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> "Server":
        binary = os.environ.get("AUGUR_BIN") or str(REPO / "target" / "debug" / "augur")
        if not Path(binary).exists():
            pytest.exit(f"no augur binary at {binary}: build it or set AUGUR_BIN", returncode=2)
        args = [binary, "serve", "--database-url", self.database_url,
                "--listen", f"127.0.0.1:{self.port}", "--token", self.admin]
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

    def call(self, method: str, path: str, token: str, body: Any = None) -> Tuple[int, Any]:
        """Augur's own REST API, as a plain HTTP client sees it."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                text = r.read()
                return r.status, json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("augur")
    url = os.environ.get("AUGUR_TEST_DATABASE_URL") or f"sqlite://{tmp / 'vizier.db'}"
    srv = Server(url, tmp / "serve.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def tokens(server: Server) -> Dict[str, str]:
    """A token of each role, made by the admin through Augur's API."""
    out = {"admin": server.admin}
    for role in ["reader", "writer"]:
        for n in ["", "2"]:
            status, body = server.call("POST", "/v1/tokens", server.admin,
                                       {"name": f"vizier-{role}{n}-{uuid.uuid4().hex[:6]}",
                                        "role": role})
            assert status == 201, body
            out[role + n] = body["token"]
    return out


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


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
