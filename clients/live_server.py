"""A live `augur serve` for the compatibility suites (clients/vizier-compat,
clients/optuna-compat): $AUGUR_BIN (or target/debug/augur) on a free loopback port, with an
admin token unless open, and Augur's own REST API as a plain HTTP client sees it.

Nothing is mocked: the clients under test talk to this real server.
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
from typing import Any, Dict, Iterable, List, Optional, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`augur serve` on a loopback port with `extra_args`; with an admin token (`admin`, or a
    fresh one named `<prefix>-admin-…`) unless `open` (no token at all: an open loopback
    server)."""

    def __init__(self, database_url: str, log_path: Path, prefix: str = "augur",
                 open: bool = False, admin: Optional[str] = None,
                 extra_args: Iterable[str] = ()) -> None:
        self.database_url = database_url
        self.log_path = log_path
        self.admin = None if open else admin or f"{prefix}-admin-" + secrets.token_hex(8)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_args = list(extra_args)
        self.process: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> "Server":
        binary = os.environ.get("AUGUR_BIN") or str(REPO / "target" / "debug" / "augur")
        if not Path(binary).exists():
            pytest.exit(f"no augur binary at {binary}: build it or set AUGUR_BIN", returncode=2)
        args: List[str] = [binary, "serve", "--database-url", self.database_url,
                           "--listen", f"127.0.0.1:{self.port}", *self.extra_args]
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

    def role_tokens(self, prefix: str, names: Iterable[str]) -> Dict[str, str]:
        """The admin token and one made through the API per name (`writer`, `reader2`: the
        role is the name without trailing digits), keyed by name."""
        out: Dict[str, str] = {"admin": self.admin or ""}
        for name in names:
            status, body = self.call("POST", "/v1/tokens", self.admin,
                                     {"name": f"{prefix}-{name}-{uuid.uuid4().hex[:6]}",
                                      "role": name.rstrip("0123456789")})
            assert status == 201, body
            out[name] = body["token"]
        return out


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
