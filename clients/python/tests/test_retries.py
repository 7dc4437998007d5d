"""Retries: 503 and 429 are retried honouring Retry-After, connection failures with backoff,
and a call that is not idempotent is never sent twice when its first outcome is unknown.
The server is real; `FaultProxy` in front of it answers or drops what a rule says."""

from __future__ import annotations

import threading
import time
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone

import pytest

import augur
from augur._http import retry_after_seconds
from conftest import free_port
from faults import FaultProxy, Rule

FAST = augur.RetryPolicy(max_retries=4, initial_backoff=0.05, max_backoff=0.2, deadline=30)


@pytest.fixture
def proxy(server):
    p = FaultProxy(server.url).start()
    yield p
    p.stop()


@pytest.fixture
def pclient(proxy):
    with augur.Client(proxy.url, retry=FAST) as c:
        yield c


def test_a_503_with_retry_after_is_retried_after_the_time_it_asks(pclient, proxy, make_spec, client):
    spec = make_spec()
    proxy.add(Rule("POST", "/v1/studies", "status", times=2, status=503, retry_after="1"))
    started = time.monotonic()
    study = pclient.create_study(spec)  # not idempotent, but a 503 means nothing was done
    assert time.monotonic() - started >= 2.0
    calls = proxy.calls("POST", "/v1/studies")
    assert [o for _, o in calls] == ["503", "503", "forward"]
    assert calls[1][0] - calls[0][0] >= 0.95 and calls[2][0] - calls[1][0] >= 0.95
    assert [s.id for s in client.studies(name=spec["name"])] == [study.id]


def test_a_429_is_retried(pclient, proxy, make_spec):
    study = pclient.create_study(make_spec())
    proxy.add(Rule("POST", r"/v1/studies/\d+/suggest", "status", times=1, status=429, retry_after="0"))
    trials = study.suggest(1, "w")
    assert len(trials) == 1
    assert [o for _, o in proxy.calls("POST", r"/v1/studies/\d+/suggest")] == ["429", "forward"]
    trials[0].fail("done")


def test_a_retry_after_given_as_a_date_is_honoured():
    later = datetime.now(timezone.utc) + timedelta(seconds=30)
    assert 28 <= retry_after_seconds(format_datetime(later, usegmt=True)) <= 30
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("soon") is None


def test_a_persistent_503_raises_unavailable_once_the_retries_are_spent(pclient, proxy):
    proxy.add(Rule("GET", "/v1/studies", "status", times=100, status=503, retry_after="0"))
    with pytest.raises(augur.Unavailable) as e:
        list(pclient.studies())
    assert e.value.status == 503
    assert len(proxy.calls("GET", "/v1/studies")) == 1 + FAST.max_retries


def test_a_refused_connection_is_retried_until_the_server_is_up(server, make_spec):
    port = free_port()
    late = {}

    def start_later() -> None:
        time.sleep(1.0)
        late["proxy"] = FaultProxy(server.url, port=port).start()

    threading.Thread(target=start_later).start()
    patient = augur.RetryPolicy(max_retries=20, initial_backoff=0.1, max_backoff=0.5, deadline=30)
    try:
        with augur.Client(f"http://127.0.0.1:{port}", retry=patient) as c:
            study = c.create_study(make_spec())  # nothing was sent: safe even to create
            assert study.id >= 1
    finally:
        time.sleep(0.1)
        if "proxy" in late:
            late["proxy"].stop()


def test_a_create_whose_answer_was_lost_is_not_sent_again(pclient, proxy, make_spec, client):
    spec = make_spec()
    proxy.add(Rule("POST", "/v1/studies", "drop_after"))
    with pytest.raises(augur.Unavailable) as e:
        pclient.create_study(spec)
    assert e.value.ambiguous and e.value.status is None
    assert len(proxy.calls("POST", "/v1/studies")) == 1
    # The server did create it, exactly once; get_or_create_study is the safe way to retry.
    created = [s.id for s in client.studies(name=spec["name"])]
    assert len(created) == 1
    assert pclient.get_or_create_study(spec).id == created[0]


def test_an_add_trial_answered_500_is_not_sent_again(pclient, proxy, make_spec):
    study = pclient.create_study(make_spec())
    proxy.add(Rule("POST", r"/v1/studies/\d+/trials", "status_after", status=500))
    with pytest.raises(augur.Internal) as e:
        study.add_trial({"lr": 0.01, "depth": 3, "opt": "adam"}, {"loss": 0.5})
    assert e.value.ambiguous
    assert len(proxy.calls("POST", r"/v1/studies/\d+/trials")) == 1
    assert study.refresh().trial_counts["total"] == 1


def test_a_suggest_whose_answer_was_lost_is_retried_and_hands_out_nothing_twice(pclient, proxy,
                                                                               make_spec):
    study = pclient.create_study(make_spec())
    proxy.add(Rule("POST", r"/v1/studies/\d+/suggest", "drop_after"))
    trials = study.suggest(1)  # a fresh client_id, kept across the retry
    assert len(trials) == 1
    assert len(proxy.calls("POST", r"/v1/studies/\d+/suggest")) == 2
    assert study.refresh().trial_counts["total"] == 1
    trials[0].fail("done")


def test_a_complete_whose_answer_was_lost_is_retried_and_reconciled(pclient, proxy, make_spec):
    study = pclient.create_study(make_spec())
    trial = study.suggest(1, "w")[0]
    proxy.add(Rule("POST", r"/v1/studies/\d+/trials/\d+/complete", "drop_after"))
    trial.complete({"loss": 0.5})  # the retry gets 409 "already completed": that was us
    assert trial.state == "completed" and trial.metrics == {"loss": 0.5}
    assert [o for _, o in proxy.calls("POST", r".*/complete")] == ["drop_after", "forward", "upstream 409"]


def test_a_fail_answered_502_is_retried_and_reconciled(pclient, proxy, make_spec):
    study = pclient.create_study(make_spec())
    trial = study.suggest(1, "w")[0]
    proxy.add(Rule("POST", r".*/fail", "status_after", status=502))
    assert trial.fail("boom").state == "failed"


def test_a_report_and_a_read_survive_dropped_connections(pclient, proxy, make_spec):
    study = pclient.create_study(make_spec())
    trial = study.suggest(1, "w")[0]
    proxy.add(Rule("POST", r".*/measurements", "drop_before", times=2))
    proxy.add(Rule("GET", r"/v1/studies/\d+/trials/\d+", "drop_after", times=1))
    trial.report(1, {"loss": 1.0})
    assert [m["step"] for m in trial.refresh().measurements] == [1]
    trial.fail("done")


def test_a_delete_whose_answer_was_lost_still_succeeds(pclient, proxy, make_spec):
    study = pclient.create_study(make_spec())
    proxy.add(Rule("DELETE", r"/v1/studies/\d+", "drop_after"))
    study.delete()  # the retry's 404 means the first attempt deleted it
    with pytest.raises(augur.NotFound):
        pclient.study(study.id)


def test_a_non_retryable_error_is_raised_at_once(pclient, proxy):
    with pytest.raises(augur.NotFound):
        pclient.study(99999999)
    assert [o for _, o in proxy.calls("GET", r"/v1/studies/99999999")] == ["forward", "upstream 404"]
