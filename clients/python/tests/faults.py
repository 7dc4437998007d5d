"""A fault-injecting HTTP proxy in front of a real Augur server, for the retry tests.

Each rule matches a method and a path (a regex) a number of times, and instead of (or after)
forwarding the request: answers an error status with a ``Retry-After``, or closes the
connection without an answer (``drop_after`` forwards first, so the server acts but the
client never hears of it). Everything else is forwarded unchanged.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Optional, Tuple

import httpx


@dataclass
class Rule:
    method: str
    path: str
    action: str  # "status", "drop_before", "drop_after", "status_after"
    times: int = 1
    status: int = 503
    retry_after: Optional[str] = None

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and method == self.method and re.fullmatch(self.path, path) is not None


@dataclass
class FaultProxy:
    upstream: str
    port: int = 0
    rules: List[Rule] = field(default_factory=list)
    log: List[Tuple[float, str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._http = httpx.Client(base_url=self.upstream, timeout=70)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?")[0]
                rule = proxy._take(self.command, path)
                action = rule.action if rule else "forward"
                proxy._record(self.command, path, action if rule is None or rule.action != "status"
                              else str(rule.status))
                if rule and rule.action == "status":
                    self._answer(rule.status, b'{"error":{"code":"unavailable","message":"injected"}}',
                                 "application/json", rule.retry_after)
                    return
                if rule and rule.action == "drop_before":
                    self._drop()
                    return
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() in ("content-type", "authorization", "accept")}
                upstream = proxy._http.request(self.command, self.path, content=body, headers=headers)
                if rule and rule.action == "drop_after":
                    self._drop()
                    return
                if rule and rule.action == "status_after":
                    self._answer(rule.status, b'{"error":{"code":"internal","message":"injected"}}',
                                 "application/json", rule.retry_after)
                    return
                if upstream.status_code >= 400:
                    proxy._record(self.command, path, f"upstream {upstream.status_code}")
                self._answer(upstream.status_code, upstream.content,
                             upstream.headers.get("content-type"), upstream.headers.get("retry-after"))

            def _answer(self, status: int, body: bytes, ctype: Optional[str],
                        retry_after: Optional[str]) -> None:
                self.send_response(status)
                if ctype:
                    self.send_header("content-type", ctype)
                if retry_after is not None:
                    self.send_header("retry-after", retry_after)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _drop(self) -> None:
                self.close_connection = True
                self.wfile.flush()
                try:
                    self.connection.shutdown(2)
                except OSError:
                    pass

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> "FaultProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._http.close()

    def add(self, rule: Rule) -> None:
        with self._lock:
            self.rules.append(rule)

    def _take(self, method: str, path: str) -> Optional[Rule]:
        with self._lock:
            for rule in self.rules:
                if rule.matches(method, path):
                    rule.times -= 1
                    return rule
        return None

    def _record(self, method: str, path: str, outcome: str) -> None:
        with self._lock:
            self.log.append((time.monotonic(), method, path, outcome))

    def calls(self, method: str, path_regex: str) -> List[Tuple[float, str]]:
        """(time, outcome) of each request that matched."""
        with self._lock:
            return [(t, o) for t, m, p, o in self.log
                    if m == method and re.fullmatch(path_regex, p)]


class TcpProxy:
    """Forwards TCP connections to a target (e.g. PostgreSQL) until cut: `cut()` closes the
    listener and every open connection, `resume()` listens again on the same port. A
    database "outage" for one Augur server, without touching the database others use."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._conns: List[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: Optional[socket.socket] = None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]

    def start(self) -> "TcpProxy":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()
        return self

    resume = start

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    stop = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass
