"""Replicas that route a busy study's changes to its owner (`augur serve --replica-url`): the
client follows the owner a forwarded answer names, and comes back to its URL when the owner
cannot be reached. Two real `augur serve` processes on one database (a SQLite file of their
own, or the run's PostgreSQL database)."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import httpx
import pytest

import augur
from augur._http import changed_study, follows
from conftest import Server, database_url

FORWARDED = 'augur_forwarded_requests_total{outcome="forwarded"}'
SERVED_HERE = 'augur_forwarded_requests_total{outcome="served_here"}'


def metric(server: Server, series: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def routed(database: str, log: Path) -> Server:
    server = Server(database, log)
    server.extra = ["--no-dispatch", "--replica-url", server.url]
    return server.start()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Tuple[Server, Server]]:
    database = database_url(tmp_path, "replicas")
    a = routed(database, tmp_path / "a.log")
    b = routed(database, tmp_path / "b.log")
    deadline = time.monotonic() + 15
    while metric(a, "augur_replicas_live") != 2 or metric(b, "augur_replicas_live") != 2:
        assert time.monotonic() < deadline, "the replicas never saw each other"
        time.sleep(0.2)
    yield a, b
    a.stop()
    b.stop()


def overlapping_suggests(server: Server, study: int, n: int = 3) -> None:
    """`n` suggests at once, on connections opened first so that they leave together."""
    clients = [httpx.Client(base_url=server.url, timeout=30) for _ in range(n)]
    for c in clients:
        c.get("/healthz")
    barrier = threading.Barrier(n)
    statuses: List[int] = []

    def send(c: httpx.Client) -> None:
        barrier.wait()
        statuses.append(c.post(f"/v1/studies/{study}/suggest", json={"count": 1}).status_code)

    threads = [threading.Thread(target=send, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    assert statuses == [200] * n


def router_and_owner(a: Server, b: Server, study: int) -> Tuple[Server, Server]:
    """Overlapping changes at one replica, then the other, until one sends some on: that one
    routes the study, to the other."""
    for _ in range(10):
        for router, owner in ((a, b), (b, a)):
            before = metric(router, FORWARDED)
            overlapping_suggests(router, study)
            if metric(router, FORWARDED) > before:
                return router, owner
    raise AssertionError(f"no replica routed study {study}")


def cycles(client: augur.Client, study_id: int, n: int) -> None:
    study = client.study(study_id)
    for _ in range(n):
        (trial,) = study.suggest(client_id="follower")
        trial.complete({"loss": 0.5})


def test_a_busy_studys_changes_go_to_the_owner_a_replica_names(replicas, make_spec):
    a, b = replicas
    with augur.Client(a.url) as creator:
        study = creator.create_study(make_spec(max_trials=200, parallel_trials=100)).id
    router, owner = router_and_owner(a, b, study)

    # Not following: every change crosses the hop.
    before = metric(router, FORWARDED)
    with augur.Client(router.url, follow_owners=False) as plain:
        cycles(plain, study, 5)
    assert metric(router, FORWARDED) - before == 10

    # Following: only the first change does; the rest go to the owner it named.
    overlapping_suggests(router, study)  # still hot, whatever the time the above took
    before = metric(router, FORWARDED)
    with augur.Client(router.url) as client:
        cycles(client, study, 5)
        assert metric(router, FORWARDED) - before == 1

        # The owner dies: the next change is refused by it (nothing sent) and goes to the
        # router, which serves it itself; later ones too.
        owner.process.kill()
        owner.process.wait()
        served_here = metric(router, SERVED_HERE)
        cycles(client, study, 3)
        assert metric(router, SERVED_HERE) > served_here
        assert metric(router, FORWARDED) - before == 1
    with augur.Client(router.url) as reader:
        assert reader.study(study).data["trial_counts"]["completed"] >= 13


def test_an_owner_that_refused_a_connection_is_not_followed_again(replicas, make_spec, caplog):
    """The owner is killed outright, its lease still live: the replica serves its study's
    changes itself (they never overlap) and keeps naming it, but the client tries it once."""
    a, b = replicas
    with augur.Client(a.url) as creator:
        for _ in range(20):
            study = creator.create_study(make_spec(max_trials=50)).id
            answer = httpx.post(f"{a.url}/v1/studies/{study}/suggest", json={"count": 1},
                                timeout=10)
            assert answer.status_code == 200
            if answer.headers.get("augur-study-replica") == b.url:
                break
        else:
            raise AssertionError("b owns none of 20 studies")
    b.process.kill()
    b.process.wait()
    caplog.set_level(logging.INFO, logger="augur")
    with augur.Client(a.url) as client:
        cycles(client, study, 3)
    tried = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(tried) == 1, [r.getMessage() for r in tried]


def test_only_changes_under_one_study_name_it():
    assert changed_study("POST", "/v1/studies/7/suggest") == 7
    assert changed_study("POST", "/v1/studies/7/trials/3/complete") == 7
    assert changed_study("patch", "/v1/studies/12") == 12
    assert changed_study("DELETE", "/v1/studies/12?x=1") == 12
    for method, path in [("GET", "/v1/studies/7/trials"), ("HEAD", "/v1/studies/7"),
                         ("POST", "/v1/studies"), ("POST", "/v1/studies/"),
                         ("POST", "/v1/studies/abc/stop"), ("POST", "/v1/studies/-1/stop"),
                         ("POST", "/v1/studies/0/stop"), ("POST", "/v1/tokens")]:
        assert changed_study(method, path) is None, (method, path)


def test_a_named_owner_is_followed_only_without_a_downgrade():
    assert follows("http://balancer:8080", "http://10.0.0.7:8080")
    assert follows("http://balancer:8080", "https://10.0.0.7:8443")
    assert follows("https://augur.example", "https://10.0.0.7:8443")
    # Replicas on one host: loopback owners, followed from that host only.
    assert follows("http://127.0.0.1:8080", "http://127.0.0.1:8081")
    assert follows("http://localhost:8080", "http://[::1]:8081")
    for elsewhere in ["http://127.0.0.1:8081", "http://127.9.9.9:8081", "http://localhost:8081",
                      "http://LocalHost.:8081", "http://[::1]:8081"]:
        assert not follows("http://augur.example:8080", elsewhere), elsewhere
    for bad in ["http://10.0.0.7:8080", "ftp://10.0.0.7", "not a url",
                "https://user:pw@10.0.0.7", "https://10.0.0.7/?x=1", "https://10.0.0.7:x",
                "file:///etc/passwd", "https://"]:
        assert not follows("https://augur.example", bad), bad
