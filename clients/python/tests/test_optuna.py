"""augur.optuna.AugurSampler: Optuna code runs on an Augur study."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import pytest

optuna = pytest.importorskip("optuna")

from augur.optuna import AugurSampler, UnsupportedSearchSpace, augur_parameter  # noqa: E402
from conftest import REPO, unique_name  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)


def augur_study(client, name):
    return next(s for s in client.studies(name=name) if s.name == name)


def test_the_discovered_search_space_becomes_the_augur_study_spec(client):
    name = unique_name("optuna")

    def objective(trial):
        lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
        units = trial.suggest_int("units", 16, 256, log=True)
        layers = trial.suggest_int("layers", 1, 9, step=2)
        dropout = trial.suggest_float("dropout", 0.0, 0.5, step=0.1)
        act = trial.suggest_categorical("act", ["relu", "tanh"])
        bias = trial.suggest_categorical("bias", [True, False, None])
        trial.suggest_float("fixed", 1.0, 1.0)  # a single value: Optuna's own, not Augur's
        assert isinstance(units, int) and isinstance(layers, int) and layers % 2 == 1
        assert round(dropout * 10) == pytest.approx(dropout * 10)
        assert bias in (True, False, None)
        return lr * units + layers + dropout + (act == "tanh") + (bias is None)

    sampler = AugurSampler(client, name, max_trials=6, parallel_trials=2, algorithm="random",
                           seed=3)
    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=6, n_jobs=2)

    augur_s = augur_study(client, name)
    params = {p["id"]: p for p in augur_s.spec["parameters"]}
    assert set(params) == {"lr", "units", "layers", "dropout", "act", "bias"}
    assert (params["lr"]["type"], params["lr"]["scale"]) == ("double", "log")
    assert (params["units"]["type"], params["units"]["scale"]) == ("integer", "log")
    assert params["layers"] == {**params["layers"], "type": "discrete", "values": [1, 3, 5, 7, 9]}
    assert params["dropout"]["values"] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    assert params["bias"]["values"] == ["True", "False", "None"]
    assert augur_s.metrics == [{"id": "value", "goal": "minimize"}]
    # every Optuna trial is an Augur trial with the same values and result
    augur_trials = {t.id: t for t in augur_s.trials()}
    assert len(augur_trials) == 6 and all(t.state == "completed" for t in augur_trials.values())
    for t in study.trials:
        mirror = augur_trials[t.system_attrs["augur:trial_id"]]
        assert mirror.metrics["value"] == pytest.approx(t.value)
        assert mirror.parameters["act"] == t.params["act"]
        assert mirror.parameters["lr"] == pytest.approx(t.params["lr"])
        assert t.system_attrs["augur:study_id"] == augur_s.id


def test_a_parameter_that_appears_after_the_first_trial_is_a_clear_error(client):
    def objective(trial):
        x = trial.suggest_float("x", 0, 1)
        if trial.number >= 1:
            trial.suggest_float("y", 0, 1)
        return x

    study = optuna.create_study(sampler=AugurSampler(client, unique_name("dyn"), algorithm="random"))
    with pytest.raises(UnsupportedSearchSpace, match="'y' is not in Augur study"):
        study.optimize(objective, n_trials=3)
    augur_s = augur_study(client, study.sampler.study_name)
    assert [t.state for t in augur_s.trials()] == ["completed", "failed"]


def test_a_changed_distribution_is_a_clear_error(client):
    def objective(trial):
        high = 1 if trial.number == 0 else 10
        return trial.suggest_float("x", 0, high)

    study = optuna.create_study(sampler=AugurSampler(client, unique_name("chg"), algorithm="random"))
    with pytest.raises(UnsupportedSearchSpace, match="must not change"):
        study.optimize(objective, n_trials=3)


def test_an_augur_study_of_that_name_with_other_objectives_is_refused(client, make_spec):
    spec = make_spec()
    client.create_study(spec)
    study = optuna.create_study(sampler=AugurSampler(client, spec["name"]))
    with pytest.raises(ValueError, match="metrics"):
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)


def test_multi_objective_studies_map_to_augur_metrics(client):
    name = unique_name("multi")
    study = optuna.create_study(directions=["minimize", "maximize"],
                                sampler=AugurSampler(client, name, algorithm="random"))
    study.optimize(lambda t: (t.suggest_float("x", 0, 1), t.suggest_float("y", 0, 1)), n_trials=4)
    augur_s = augur_study(client, name)
    assert augur_s.metrics == [{"id": "value_0", "goal": "minimize"}, {"id": "value_1", "goal": "maximize"}]
    assert augur_s.refresh().trial_counts["completed"] == 4
    assert len(augur_s.optimal_trials()) >= 1


def test_failed_and_pruned_trials_are_failed_and_completed_in_augur(client):
    name = unique_name("outcomes")

    def objective(trial):
        x = trial.suggest_float("x", 0, 1)
        if trial.number == 1:
            raise RuntimeError("boom")
        if trial.number == 2:
            trial.report(0.9, 1)
            trial.report(0.8, 2)
            raise optuna.TrialPruned()
        return x

    study = optuna.create_study(sampler=AugurSampler(client, name, algorithm="random"))
    study.optimize(objective, n_trials=4, catch=(RuntimeError,))
    by_id = {t.id: t for t in augur_study(client, name).trials()}
    states = [by_id[t.system_attrs["augur:trial_id"]].state if "augur:trial_id" in t.system_attrs
              else None for t in study.trials]
    assert states == ["completed", "failed", "completed", "completed"]
    pruned = by_id[study.trials[2].system_attrs["augur:trial_id"]]
    assert pruned.metrics == {"value": 0.8}
    assert [m["step"] for m in pruned.measurements] == [1, 2]


def test_a_spent_budget_stops_the_optuna_study(client):
    name = unique_name("budget")
    study = optuna.create_study(sampler=AugurSampler(client, name, max_trials=3, algorithm="random"))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=10)
    states = [t.state for t in study.trials]
    assert states[:3] == [optuna.trial.TrialState.COMPLETE] * 3
    assert states[3:] == [optuna.trial.TrialState.PRUNED]  # the one that asked; then stopped
    assert augur_study(client, name).refresh().state == "completed"


def test_an_enqueued_trial_is_run_as_given_and_added_to_augur(client):
    name = unique_name("enq")
    study = optuna.create_study(sampler=AugurSampler(client, name, algorithm="random"))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    study.enqueue_trial({"x": 0.25})
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert study.trials[1].params == {"x": 0.25}
    values = sorted(t.parameters["x"] for t in augur_study(client, name).trials())
    assert 0.25 in values and len(values) == 3


def test_several_threads_wait_for_one_discovery_trial(client):
    name = unique_name("threads")
    sampler = AugurSampler(client, name, max_trials=12, parallel_trials=4, algorithm="random")
    study = optuna.create_study(sampler=sampler)
    study.optimize(lambda t: t.suggest_float("x", -1, 1) ** 2, n_trials=12, n_jobs=4)
    trials = list(augur_study(client, name).trials())
    assert len(trials) == 12 and all(t.state == "completed" for t in trials)
    # one discovery trial (added), the rest suggested by Augur to this process
    assert sum(1 for t in trials if t.data.get("client_id") is None) == 1


def test_categorical_choices_with_clashing_string_forms_are_refused():
    with pytest.raises(UnsupportedSearchSpace, match="distinct"):
        augur_parameter("c", optuna.distributions.CategoricalDistribution([1, "1"]))


def run_bench(url, seeds, samplers):
    out = subprocess.run(
        [sys.executable, str(REPO / "benches" / "quality" / "optuna_bridge.py"), "--url", url,
         "--functions", "branin", "--seeds", seeds, "--samplers", samplers, "--json"],
        capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_branin_from_two_processes_with_four_jobs_beats_random_search(server):
    """The bridge's quality, small: Branin, budget 50, 2 processes x n_jobs=4 on one Augur
    study (found by name), 2 seeds; random search, 5 seeds, the same way on a shared Optuna
    storage. The full comparison (with TPE, Hartmann6, more seeds) is the bench."""
    bridge = run_bench(server.url, "0,1", "augur")
    random_search = run_bench(server.url, "0-4", "random")
    for r in bridge:
        assert r["every_trial_shown"], r
        assert r["augur_trials"] == 50 and r["optuna_complete"] == 50, r
    bridge_regret = statistics.median(r["regret"] for r in bridge)
    random_regret = statistics.median(r["regret"] for r in random_search)
    print(f"branin median regret: bridge {bridge_regret:.3g}, random {random_regret:.3g}")
    assert bridge_regret < 0.25 * random_regret
    assert math.isfinite(bridge_regret)


CAPPED = """
import sys, time, optuna, augur
from augur.optuna import AugurSampler
optuna.logging.set_verbosity(optuna.logging.WARNING)
url, name = sys.argv[1], sys.argv[2]
sampler = AugurSampler(augur.Client(url), name, max_trials=12, parallel_trials=3, algorithm="random")

def objective(trial):
    x = trial.suggest_float("x", -1, 1)
    time.sleep(0.3)
    return x * x

optuna.create_study(sampler=sampler).optimize(objective, n_trials=6, n_jobs=4)
"""


def test_two_processes_with_four_jobs_each_keep_to_the_augur_cap(server, client, tmp_path):
    name = unique_name("capped")
    script = tmp_path / "capped.py"
    script.write_text(CAPPED)
    procs = [subprocess.Popen([sys.executable, str(script), server.url, name]) for _ in range(2)]
    assert [p.wait(300) for p in procs] == [0, 0]
    trials = list(augur_study(client, name).trials())
    assert len(trials) == 12 and all(t.state == "completed" for t in trials)
    # Trials Augur handed out ran in [started_at, completed_at]: never more than 3 at once.
    def at(stamp):  # RFC 3339 with 0-9 fractional digits: compare as nanoseconds
        whole, _, frac = stamp.rstrip("Z").partition(".")
        return whole, int(frac.ljust(9, "0"))

    events = sorted(
        [(at(t.data["started_at"]), 1) for t in trials if t.data["started_at"]]
        + [(at(t.data["completed_at"]), -1) for t in trials if t.data["started_at"]],
        key=lambda e: (e[0], e[1]),
    )
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert peak == 3
