"""PostgreSQL only: a worker's calls ride out a database outage. A TCP proxy between this
test's own `augur serve` and PostgreSQL is cut for longer than the server's pool waits (10 s),
so the server answers 503 (`unavailable`, with Retry-After) in the meantime; the client retries
the idempotent call until the database is back. (Only this server loses its database: others on the machine are untouched.)"""

from __future__ import annotations

import os
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import pytest

import augur
from conftest import Server, unique_name
from faults import FaultProxy, TcpProxy

OUTAGE_SECS = 13


@pytest.fixture
def outage_server(tmp_path, backend):
    if backend != "postgres":
        pytest.skip("needs a database server to cut off (PostgreSQL)")
    url = urlsplit(os.environ["AUGUR_TEST_DATABASE_URL"])
    tcp = TcpProxy(url.hostname or "127.0.0.1", url.port or 5432).start()
    netloc = f"{url.username}:{url.password}@127.0.0.1:{tcp.port}"
    server = Server(urlunsplit(url._replace(netloc=netloc)), tmp_path / "outage.log").start()
    http = FaultProxy(server.url).start()
    yield tcp, http
    http.stop()
    server.stop()
    tcp.cut()


def test_a_report_during_a_database_outage_succeeds_once_it_is_back(outage_server):
    tcp, http = outage_server
    with augur.Client(http.url) as client:
        study = client.create_study({
            "name": unique_name("outage"), "algorithm": "random",
            "metrics": [{"id": "loss", "goal": "minimize"}],
            "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
            "max_trials": 2,
        })
        trial = study.suggest(1, "w")[0]
        trial.release()  # only the report under test talks to the server
        tcp.cut()
        threading.Timer(OUTAGE_SECS, tcp.resume).start()
        started = time.monotonic()
        trial.report(1, {"loss": 0.5})
        waited = time.monotonic() - started
        assert waited >= OUTAGE_SECS - 1
        outcomes = [o for _, o in http.calls("POST", r".*/measurements")]
        assert "upstream 503" in outcomes and outcomes[-1] == "forward", outcomes
        assert trial.complete().metrics == {"loss": 0.5}
