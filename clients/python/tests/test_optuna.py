"""augur.optuna.AugurSampler: Optuna code runs on an Augur study."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time

import pytest

optuna = pytest.importorskip("optuna")

import augur.optuna as bridge  # noqa: E402
from augur.optuna import AugurSampler, UnsupportedSearchSpace, augur_parameter  # noqa: E402
from conftest import REPO, unique_name  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(autouse=True)
def finish_samplers(client):
    """After each test, every sampler ends its study as it would at interpreter exit, while
    the server and the client are still up (at the real exit they are not)."""
    yield
    bridge._finish_at_exit()


def augur_study(client, name):
    return next(s for s in client.studies(name=name) if s.name == name)


def tree(augur_s):
    """The study's parameters by id, each with its ``parent`` id and the parent's ``when``."""
    out = {}

    def walk(params, parent, when):
        for p in params:
            out[p["id"]] = {**p, "parent": parent, "when": when}
            for child in p.get("children") or []:
                walk(child["parameters"], p["id"], child["when"])

    walk(augur_s.spec["parameters"], None, None)
    return out


def asked(trial):
    """An Optuna trial's values as Augur keeps them (categoricals by their string form)."""
    return {name: bridge._encode(value, trial.distributions[name], name)
            for name, value in trial.params.items() if not trial.distributions[name].single()}


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
    params = tree(augur_s)
    assert set(params) == {"lr", "units", "layers", "dropout", "act", "bias"}
    assert (params["lr"]["type"], params["lr"]["scale"]) == ("double", "log")
    assert (params["units"]["type"], params["units"]["scale"]) == ("integer", "log")
    assert params["layers"]["type"] == "discrete"
    assert params["layers"]["values"] == [1, 3, 5, 7, 9]
    assert params["dropout"]["values"] == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    assert params["bias"]["values"] == ["True", "False", "None"]
    # The parent rule: `layers` (5 values) is the last switch before dropout and act; `units`
    # (241 values) is a size, never a parent; `bias` follows the categorical `act`.
    assert [params[p]["parent"] for p in ("lr", "units", "layers")] == [None] * 3
    assert (params["dropout"]["parent"], params["act"]["parent"]) == ("layers", "layers")
    assert params["bias"]["parent"] == "act"
    assert augur_s.metrics == [{"id": "value", "goal": "minimize"}]
    # every Optuna trial is an Augur trial with the same values and result, including the
    # values the fallback sampler gave where a child was not active yet
    augur_trials = {t.id: t for t in augur_s.trials()}
    assert len(augur_trials) == 6 and all(t.state == "completed" for t in augur_trials.values())
    for t in study.trials:
        mirror = augur_trials[t.system_attrs["augur:trial_id"]]
        assert mirror.metrics["value"] == pytest.approx(t.value)
        assert mirror.parameters.keys() == asked(t).keys()
        assert mirror.parameters["act"] == t.params["act"]
        assert mirror.parameters["bias"] == str(t.params["bias"])
        assert mirror.parameters["lr"] == pytest.approx(t.params["lr"])
        assert t.system_attrs["augur:study_id"] == augur_s.id


def test_a_parameter_that_appears_after_the_first_trial_joins_the_space(client):
    """`y`, first asked in the second trial after only a float, is added at the top level,
    its first value recorded in the Augur trial that revealed it; Augur suggests it after."""
    def objective(trial):
        x = trial.suggest_float("x", 0, 1)
        if trial.number >= 1:
            return x + trial.suggest_float("y", 0, 1)
        return x

    name = unique_name("dyn")
    study = optuna.create_study(sampler=AugurSampler(client, name, algorithm="random"))
    study.optimize(objective, n_trials=4)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 4
    augur_s = augur_study(client, name)
    assert tree(augur_s)["y"]["parent"] is None
    mirrors = {t.id: t for t in augur_s.trials()}
    for t in study.trials:
        assert mirrors[t.system_attrs["augur:trial_id"]].parameters == asked(t)


def test_a_parameter_without_a_parent_rule_is_top_level(client):
    """`conditional=False`: a parameter asked under a branch joins the top level, and Augur
    suggests it in every later trial (used or not)."""
    def objective(trial):
        if trial.suggest_categorical("kind", ["a", "b"]) == "a":
            return trial.suggest_float("w", 0, 1)
        return 0.5

    name = unique_name("flat")
    sampler = AugurSampler(client, name, algorithm="random", seed=1, conditional=False)
    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=8)
    augur_s = augur_study(client, name)
    assert tree(augur_s)["w"]["parent"] is None
    trials = list(augur_s.trials())
    first_w = next(i for i, t in enumerate(trials) if "w" in t.parameters)
    assert all("w" in t.parameters for t in trials[first_w:])


CONDITIONAL_SEEDS = range(6)


def conditional_objective(trial):
    """Define-by-run: momentum under sgd and rmsprop, eps under adam; best at sgd with
    momentum 0.9 and x 0.5."""
    x = trial.suggest_float("x", -2, 2)
    opt = trial.suggest_categorical("optimizer", ["sgd", "adam", "rmsprop"])
    if opt in ("sgd", "rmsprop"):
        m = trial.suggest_float("momentum", 0.0, 1.0)
        return (x - 0.5) ** 2 + (m - 0.9) ** 2 + (0.1 if opt == "rmsprop" else 0.0)
    eps = trial.suggest_float("eps", 1e-8, 1e-4, log=True)
    return (x - 0.5) ** 2 + 0.3 + 0.01 * math.log10(eps / 1e-8)


def test_define_by_run_conditional_spaces_work_whichever_branch_the_first_trial_takes(client):
    """The user's report: a conditional parameter failed with UnsupportedSearchSpace unless
    the first trial took its branch (2 of 5 seeds). Over 6 seeds (the first trial on each
    branch, checked) every trial completes; each child hangs under the values of its parent
    that revealed it, and every Augur trial holds exactly the values its Optuna trial ran
    with, those the fallback sampler gave included."""
    firsts = set()
    for seed in CONDITIONAL_SEEDS:
        name = unique_name(f"cond{seed}")
        with AugurSampler(client, name, seed=seed, max_trials=100) as sampler:
            study = optuna.create_study(sampler=sampler)
            study.optimize(conditional_objective, n_trials=14)
        firsts.add(study.trials[0].params["optimizer"])
        states = {t.state for t in study.trials}
        assert states == {optuna.trial.TrialState.COMPLETE}, (seed, states)
        augur_s = augur_study(client, name)
        params = tree(augur_s)
        taken = {t.params["optimizer"] for t in study.trials}
        if "adam" in taken:
            assert (params["eps"]["parent"], params["eps"]["when"]) == ("optimizer", ["adam"])
        momentum_values = sorted(taken & {"sgd", "rmsprop"})
        assert params["momentum"]["parent"] == "optimizer", seed
        assert sorted(params["momentum"]["when"]) == momentum_values, seed
        mirrors = {t.id: t for t in augur_s.trials()}
        assert len(mirrors) == 14 and all(t.state == "completed" for t in mirrors.values())
        for t in study.trials:
            mirror = mirrors[t.system_attrs["augur:trial_id"]]
            assert mirror.parameters.keys() == asked(t).keys(), (seed, t.number)
            for key, value in asked(t).items():
                assert mirror.parameters[key] == pytest.approx(value), (seed, t.number, key)
        # Ended when the sampler was done: the budget lowered to the trials run.
        assert augur_s.refresh().state == "completed"
        assert augur_s.spec["max_trials"] == 14
    # Both branches came first for some seeds (else this test proves less than it says).
    assert "adam" in firsts and firsts & {"sgd", "rmsprop"}, firsts


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


def test_loaded_trials_get_the_distributions_the_bridge_made_the_spec_from():
    """The inverse of augur_parameter, for trials loaded from a study this process has not
    asked: string forms back to Python values, stepped values back to steps."""
    D = optuna.distributions
    for dist in [D.FloatDistribution(1e-5, 1e-1, log=True), D.IntDistribution(16, 256, log=True),
                 D.IntDistribution(1, 9, step=2), D.FloatDistribution(0.0, 0.5, step=0.1),
                 D.CategoricalDistribution([True, False, None, "relu", 3, 2.5])]:
        assert bridge._distribution_of(augur_parameter("p", dist)) == dist
    uneven = bridge._distribution_of({"type": "discrete", "values": [1, 2, 4, 8]})
    assert uneven == D.CategoricalDistribution([1, 2, 4, 8])
    assert bridge._loaded_value(4, uneven, "p") == 4


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


def test_a_completed_study_loads_its_trials_into_optuna_and_says_how_to_go_on(client, caplog):
    """The user's report: re-running under the same name raised "no trials left to run",
    then `study.best_value` "No trials are completed yet". Now the finished trials come into
    the Optuna study (best value, best params, dataframe), the log says how to run more or
    start afresh, and raising the budget runs more on the same study."""
    name = unique_name("rerun")

    def objective(trial):
        x = trial.suggest_float("x", -1, 1)
        if trial.suggest_categorical("kind", ["a", "b"]) == "a":
            x += trial.suggest_int("k", 0, 3)
        return x * x

    with AugurSampler(client, name, algorithm="random", seed=3) as first:
        done = optuna.create_study(sampler=first)
        done.optimize(objective, n_trials=5)
    augur_s = augur_study(client, name)
    assert (augur_s.state, augur_s.spec["max_trials"]) == ("completed", 5)

    again = optuna.create_study(sampler=AugurSampler(client, name))
    with caplog.at_level("WARNING", logger="augur.optuna"):
        again.optimize(objective, n_trials=5)
    loaded = [t for t in again.trials if t.system_attrs.get("augur:loaded")]
    assert len(loaded) == 5
    assert [t.state for t in again.trials if t not in loaded] == [optuna.trial.TrialState.PRUNED]
    assert again.best_value == pytest.approx(done.best_value)
    assert again.best_params == done.best_params
    frame = again.trials_dataframe()
    assert len(frame) == 6
    assert {f"params_{p}" for t in done.trials for p in t.params} <= set(frame.columns)
    assert {"k", "kind"} <= {p for t in done.trials for p in t.params}, "both branches ran"
    said = caplog.text
    assert f"Augur study {augur_s.id} {name!r} is completed" in said
    assert "update(max_trials=" in said and "another study_name" in said
    assert f"augur study delete {augur_s.id}" in said
    assert len(list(augur_s.trials())) == 5, "nothing ran on the completed study"

    # An active study found by a fresh process: its trials come along, and the run goes on.
    augur_s.update(max_trials=8)
    with AugurSampler(client, name) as third:
        more = optuna.create_study(sampler=third)
        more.optimize(objective, n_trials=3)
    assert len(more.trials) == 8
    assert sum(1 for t in more.trials if t.system_attrs.get("augur:loaded")) == 5
    assert len(list(augur_s.trials())) == 8
    assert augur_s.refresh().state == "completed"


SCRIPT = """
import json, sys, time, optuna, augur
from augur.optuna import AugurSampler
optuna.logging.set_verbosity(optuna.logging.WARNING)
url, name, n, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])

def objective(trial):
    x = trial.suggest_float("x", -1, 1)
    if trial.suggest_categorical("kind", ["a", "b"]) == "b":
        x += trial.suggest_float("shift", 0, 1)
    time.sleep(pause)
    return x * x

# No `with`, no finish(): the study ends as the interpreter exits.
study = optuna.create_study(sampler=AugurSampler(augur.Client(url), name, algorithm="random",
                                                 parallel_trials=4))
study.optimize(objective, n_trials=n)
loaded = [t for t in study.trials if t.system_attrs.get("augur:loaded")]
ran = [t for t in study.trials if t not in loaded and t.state == optuna.trial.TrialState.COMPLETE]
print(json.dumps({"ran": len(ran), "best": study.best_value, "loaded": len(loaded)}))
"""


def run_script(tmp_path, url, name, n, pause=0.0):
    script = tmp_path / "bridge.py"
    script.write_text(SCRIPT)
    return subprocess.Popen([sys.executable, str(script), url, name, str(n), str(pause)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcome(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


def test_a_bridge_script_ends_its_study_at_exit_and_a_rerun_loads_it(server, client, tmp_path):
    """The user's report: bridge studies stayed `active` at 30 of 1,000 after `optimize`
    returned. A script that neither finishes the sampler nor uses `with` ends its study as
    the interpreter exits (completed, max_trials = its trials); running it again loads them
    and says what to do."""
    name = unique_name("exit")
    first, _ = outcome(run_script(tmp_path, server.url, name, 6))
    augur_s = augur_study(client, name)
    assert (augur_s.state, augur_s.spec["max_trials"]) == ("completed", 6)
    assert (first["ran"], first["loaded"]) == (6, 0)
    second, err = outcome(run_script(tmp_path, server.url, name, 6))
    assert second == {"ran": 0, "best": first["best"], "loaded": 6}
    assert "is completed" in err and f"augur study delete {augur_s.id}" in err
    assert len(list(augur_s.trials())) == 6


def test_a_shared_study_ends_only_when_its_last_process_is_done(server, client, tmp_path):
    """Two processes on one study, one done long before the other: the first leaves the
    study active (the other holds a trial), the other runs all of its trials (none cut
    short by the first one's exit) and ends it."""
    name = unique_name("shared")
    slow = run_script(tmp_path, server.url, name, 12, pause=0.5)
    deadline = time.monotonic() + 60
    # Past its discovery trial: a trial of its own in Augur's hands.
    while sum(s.trial_counts.get("total", 0) for s in client.studies(name=name)) < 2:
        assert time.monotonic() < deadline and slow.poll() is None, "no study"
        time.sleep(0.1)
    fast_out, fast_err = outcome(run_script(tmp_path, server.url, name, 3))
    if slow.poll() is None:  # (on a slow machine it may be done already)
        assert augur_study(client, name).refresh().state == "active", fast_err[-2000:]
    slow_out, _ = outcome(slow)
    assert (fast_out["ran"], slow_out["ran"]) == (3, 12)
    augur_s = augur_study(client, name)
    assert augur_s.state == "completed"
    assert augur_s.spec["max_trials"] == 15 == len(list(augur_s.trials()))


def test_a_process_still_discovering_when_another_ends_the_study_reopens_it(client):
    """Two samplers (two processes' worth) on one study: B's discovery trial is still
    running, unseen by Augur, when A, alone as far as Augur can tell, finishes and ends the
    study. B, begun before that, raises the budget back and runs all of its trials, then
    ends the study with everyone's trials."""
    import threading

    name = unique_name("reopen")
    a_done = threading.Event()

    def slow_first(trial):
        x = trial.suggest_float("x", -1, 1)
        if trial.number == 0:
            assert a_done.wait(60)
        return x * x

    def fast(trial):
        return trial.suggest_float("x", -1, 1) ** 2

    b = AugurSampler(client, name, algorithm="random")
    b_study = optuna.create_study(sampler=b)
    runner = threading.Thread(target=b_study.optimize, args=(slow_first,),
                              kwargs={"n_trials": 6})
    runner.start()
    deadline = time.monotonic() + 60
    while b._began is None:  # B's discovery trial has begun
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with AugurSampler(client, name, algorithm="random") as a:
        optuna.create_study(sampler=a).optimize(fast, n_trials=3)
    augur_s = augur_study(client, name)
    assert (augur_s.state, augur_s.spec["max_trials"]) == ("completed", 3), "A ended it"
    a_done.set()
    runner.join(120)
    b.finish()
    own = [t for t in b_study.trials if not t.system_attrs.get("augur:loaded")]
    assert [t.state for t in own] == [optuna.trial.TrialState.COMPLETE] * 6
    assert len(b_study.trials) == 9, "with A's three, loaded when B found the study"
    augur_s.refresh()
    assert (augur_s.state, augur_s.spec["max_trials"]) == ("completed", 9)
    assert len(list(augur_s.trials())) == 9
