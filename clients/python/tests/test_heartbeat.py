"""A held trial's background heartbeat keeps its lease; a released one goes back to the
study when its lease runs out. Studies here have a 3-second `trial_lease_secs`."""

from __future__ import annotations

import gc
import time

import pytest

import augur

LEASE = 3


@pytest.fixture
def study(client, make_spec):
    return client.create_study(make_spec(parallel_trials=1, trial_lease_secs=LEASE))


def test_a_held_trial_keeps_its_lease_well_past_it(study):
    trial = study.suggest(1, "holder")[0]
    time.sleep(2 * LEASE + 1)
    # Another worker asking (which also expires stale leases) gets nothing: the cap is full.
    other = study.suggest(1, "other")
    assert list(other) == [] and other.retry_after_secs is not None
    assert study.trial(trial.id).state == "active"
    assert study.trial(trial.id).data["client_id"] == "holder"
    assert trial.held and trial.lease_lost is None
    trial.complete({"loss": 1.0})
    assert not trial.held


def test_a_released_trial_returns_to_the_study_with_its_parameters(study):
    trial = study.suggest(1, "quitter")[0]
    trial.release()
    time.sleep(LEASE + 1)
    taken = study.suggest(1, "other")
    assert [t.id for t in taken] == [trial.id]
    assert taken[0].parameters == trial.parameters
    assert taken[0].data["client_id"] == "other"
    taken[0].complete({"loss": 1.0})


def test_a_dropped_trial_stops_beating(study):
    trial = study.suggest(1, "forgetful")[0]
    trial_id = trial.id
    del trial
    gc.collect()
    time.sleep(LEASE + 1)
    taken = study.suggest(1, "other")
    assert [t.id for t in taken] == [trial_id]
    taken[0].fail("done")


def test_the_heartbeat_notices_a_trial_finished_elsewhere(study):
    trial = study.suggest(1, "holder")[0]
    study.trial(trial.id).complete({"loss": 2.0})  # e.g. by an operator
    deadline = time.monotonic() + 5 * LEASE
    while trial.held and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not trial.held
    assert isinstance(trial.lease_lost, augur.Conflict)


def test_a_heartbeat_after_the_lease_ran_out_raises_conflict(study):
    trial = study.suggest(1, "late")[0]
    trial.release()
    time.sleep(LEASE + 1)
    with pytest.raises(augur.Conflict):
        trial.heartbeat()
