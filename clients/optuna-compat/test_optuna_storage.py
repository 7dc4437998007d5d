"""Optuna's own GrpcStorageProxy (pinned in requirements.txt) against a live `augur serve
--optuna-grpc-listen`: every RPC of `optuna.StorageService`, its errors as Optuna's
exceptions, several processes on one study, multi-objective and enqueued (WAITING) trials,
seeded runs equal to Optuna's in-memory storage, and the studies in Augur's REST API."""

from __future__ import annotations

import math
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

import grpc
import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.exceptions import DuplicatedStudyError, UpdateFinishedTrialError
from optuna.storages import GrpcStorageProxy
from optuna.storages._grpc.auto_generated import api_pb2
from optuna.study import StudyDirection
from optuna.trial import TrialState

from conftest import Server, TokenStorageProxy, unique

optuna.logging.set_verbosity(optuna.logging.WARNING)


def objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -10, 10)
    lr = trial.suggest_float("lr", 1e-5, 1e-1, log=True)
    n = trial.suggest_int("n", 1, 8)
    kind = trial.suggest_categorical("kind", ["a", "b", None, 3.5])
    penalty = {"a": 0.0, "b": 1.0, None: 2.0, 3.5: 0.5}[kind]
    for step in range(3):
        trial.report((x - 2) ** 2 / (step + 1) + penalty, step)
    return (x - 2) ** 2 + math.log10(lr) ** 2 / 10 + n + penalty


def pruned_objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -5, 5)
    for step in range(5):
        trial.report(x * x + 5 - step, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return x * x


def summary(study: optuna.Study) -> List[Any]:
    return [(t.number, t.state, t.params, t.values, t.intermediate_values,
             t.user_attrs, t.system_attrs, t.distributions) for t in study.trials]


# Studies -------------------------------------------------------------------------------------

def test_study_calls_round_trip(storage: TokenStorageProxy) -> None:
    name = unique("study")
    study_id = storage.create_new_study([StudyDirection.MAXIMIZE], name)
    assert storage.get_study_id_from_name(name) == study_id
    assert storage.get_study_name_from_id(study_id) == name
    assert storage.get_study_directions(study_id) == [StudyDirection.MAXIMIZE]
    storage.set_study_user_attr(study_id, "owner", {"team": "ml", "n": 3})
    storage.set_study_system_attr(study_id, "sys", [1, 2.5, "x"])
    assert storage.get_study_user_attrs(study_id) == {"owner": {"team": "ml", "n": 3}}
    assert storage.get_study_system_attrs(study_id) == {"sys": [1, 2.5, "x"]}
    everything = {s.study_name: s for s in storage.get_all_studies()}
    assert everything[name]._study_id == study_id
    assert everything[name].user_attrs == {"owner": {"team": "ml", "n": 3}}
    assert everything[name].directions == [StudyDirection.MAXIMIZE]
    storage.get_all_trials(study_id)
    storage.delete_study(study_id)
    with pytest.raises(KeyError):
        storage.get_study_name_from_id(study_id)
    with pytest.raises(KeyError):
        storage.get_all_trials(study_id)
    assert name not in {s.study_name for s in storage.get_all_studies()}


def test_missing_and_duplicate_studies_raise_optunas_errors(storage: TokenStorageProxy) -> None:
    name = unique("dup")
    with pytest.raises(KeyError):
        optuna.load_study(study_name=name, storage=storage)
    optuna.create_study(study_name=name, storage=storage)
    with pytest.raises(DuplicatedStudyError):
        optuna.create_study(study_name=name, storage=storage)
    again = optuna.create_study(study_name=name, storage=storage, load_if_exists=True)
    assert again.study_name == name
    with pytest.raises(KeyError):
        storage.delete_study(10**9)
    with pytest.raises(KeyError):
        storage.get_trial(10**12 + 1)


def test_tokens_are_checked_as_on_the_rest_api(server: Server, tokens: Dict[str, str]) -> None:
    bad = TokenStorageProxy(host="127.0.0.1", port=server.grpc_port, token="not-a-token-x")
    with pytest.raises(grpc.RpcError) as refused:
        bad.get_all_studies()
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    no_token = GrpcStorageProxy(host="127.0.0.1", port=server.grpc_port)
    with pytest.raises(grpc.RpcError) as anonymous:
        no_token.get_all_studies()
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    reader = TokenStorageProxy(host="127.0.0.1", port=server.grpc_port, token=tokens["reader"])
    reader.get_all_studies()
    with pytest.raises(grpc.RpcError) as denied:
        optuna.create_study(study_name=unique("reader"), storage=reader)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED


# Trials --------------------------------------------------------------------------------------

def test_trial_calls_round_trip(storage: TokenStorageProxy) -> None:
    study_id = storage.create_new_study([StudyDirection.MINIMIZE], unique("trials"))
    trial_id = storage.create_new_trial(study_id)
    assert storage.get_trial_id_from_study_id_trial_number(study_id, 0) == trial_id
    storage.set_trial_param(trial_id, "x", 0.25, FloatDistribution(0, 1))
    storage.set_trial_param(trial_id, "c", 1, CategoricalDistribution(["p", "q"]))
    storage.set_trial_param(trial_id, "n", 4, IntDistribution(1, 8, step=1))
    storage.set_trial_intermediate_value(trial_id, 0, 3.5)
    storage.set_trial_intermediate_value(trial_id, 2, 1.5)
    storage.set_trial_user_attr(trial_id, "u", {"a": [1, 2]})
    storage.set_trial_system_attr(trial_id, "s", "v")
    running = storage.get_trial(trial_id)
    assert running.state == TrialState.RUNNING
    assert running.datetime_start is not None and running.datetime_complete is None
    assert storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [0.75])
    trial = storage.get_trial(trial_id)
    assert trial.number == 0
    assert trial.state == TrialState.COMPLETE
    assert trial.values == [0.75]
    assert trial.params == {"x": 0.25, "c": "q", "n": 4}
    assert trial.distributions["n"] == IntDistribution(1, 8, step=1)
    assert trial.intermediate_values == {0: 3.5, 2: 1.5}
    assert trial.user_attrs == {"u": {"a": [1, 2]}}
    assert trial.system_attrs == {"s": "v"}
    assert trial.datetime_complete is not None
    with pytest.raises(UpdateFinishedTrialError):
        storage.set_trial_param(trial_id, "y", 0.5, FloatDistribution(0, 1))
    with pytest.raises(UpdateFinishedTrialError):
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
    with pytest.raises(UpdateFinishedTrialError):
        storage.set_trial_intermediate_value(trial_id, 3, 1.0)
    with pytest.raises(UpdateFinishedTrialError):
        storage.set_trial_user_attr(trial_id, "late", 1)
    failed = storage.create_new_trial(study_id)
    assert storage.set_trial_state_values(failed, TrialState.FAIL)
    states = [t.state for t in storage.get_all_trials(study_id)]
    assert states == [TrialState.COMPLETE, TrialState.FAIL]
    with pytest.raises(KeyError):
        storage.get_trial_id_from_study_id_trial_number(study_id, 7)


def _distribution_outcomes(store: Any) -> List[Any]:
    """Set parameters of a second trial against the first's distributions, as an Optuna
    program whose search space changed would: what each call raised, then the params kept."""
    study_id = store.create_new_study([StudyDirection.MINIMIZE], unique("dists"))
    first = store.create_new_trial(study_id)
    store.set_trial_param(first, "x", 0.5, FloatDistribution(0, 1))
    store.set_trial_param(first, "lr", 0.01, FloatDistribution(1e-4, 1, log=True))
    store.set_trial_param(first, "n", 2, IntDistribution(1, 8))
    store.set_trial_param(first, "c", 0, CategoricalDistribution(["a", "b", None]))
    second = store.create_new_trial(study_id)
    outcomes: List[Any] = []

    def attempt(trial_id: int, name: str, value: float, dist: Any) -> None:
        try:
            store.set_trial_param(trial_id, name, value, dist)
            outcomes.append((name, "ok"))
        except Exception as e:  # noqa: BLE001 - the exception's class is what is compared
            outcomes.append((name, type(e).__name__))

    attempt(second, "x", 3.0, FloatDistribution(-5, 5))                   # another range
    attempt(second, "x", 1, IntDistribution(0, 1))                        # another class
    attempt(second, "x", 0.5, FloatDistribution(0.1, 1, log=True))       # another scale
    attempt(second, "lr", 0.5, FloatDistribution(0.1, 1))                 # log lost
    attempt(second, "n", 3, IntDistribution(1, 16, log=True))             # log gained
    attempt(second, "n", 3, FloatDistribution(1, 16))                     # int to float
    attempt(second, "n", 5, IntDistribution(0, 50, step=5))               # another step
    attempt(second, "c", 1, CategoricalDistribution(["a", "c", None]))    # other choices
    attempt(second, "c", 1, CategoricalDistribution(["b", "a", None]))    # other order
    attempt(second, "c", 0, FloatDistribution(0, 1))                      # not categorical
    attempt(second, "c", 1, CategoricalDistribution(["a", "b", None]))    # the same
    attempt(second, "new", 0.5, FloatDistribution(0, 1))                  # a new name
    attempt(10**12 + 7, "x", 1, IntDistribution(0, 1))                    # no such trial
    store.set_trial_state_values(second, TrialState.COMPLETE, [1.0])
    attempt(second, "x", 1, IntDistribution(0, 1))                        # finished first
    outcomes.append(store.get_trial(second).params)
    return outcomes


def test_incompatible_distributions_raise_optunas_value_error(storage: TokenStorageProxy) -> None:
    ours = _distribution_outcomes(storage)
    theirs = _distribution_outcomes(optuna.storages.InMemoryStorage())
    assert ours == theirs
    assert ("x", "ValueError") in ours and ("c", "ValueError") in ours
    # And in a study: a suggest that changes a parameter's kind fails as Optuna's does.
    study = optuna.create_study(study_name=unique("dists"), storage=storage)
    study.optimize(lambda t: t.suggest_float("p", 0, 1), n_trials=1)
    with pytest.raises(ValueError):
        study.optimize(lambda t: t.suggest_int("p", 0, 1), n_trials=1)


def test_concurrent_creates_of_one_name_make_one_study(server: Server, tokens: Dict[str, str]) -> None:
    """16 clients create one name at the same instant: one creates it, the others get
    DuplicatedStudyError; with load_if_exists=True all 16 get that one study."""
    def race(name: str, load_if_exists: bool) -> List[Any]:
        start = threading.Barrier(16)

        def create(_: int) -> Any:
            proxy = TokenStorageProxy(host="127.0.0.1", port=server.grpc_port,
                                      token=tokens["writer"])
            proxy.get_all_studies()  # connected before the barrier
            start.wait()
            try:
                study = optuna.create_study(study_name=name, storage=proxy,
                                            load_if_exists=load_if_exists)
                return proxy.get_study_id_from_name(study.study_name)
            except DuplicatedStudyError:
                return "duplicate"

        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(create, range(16)))

    name = unique("race")
    outcomes = race(name, False)
    created = [o for o in outcomes if o != "duplicate"]
    assert len(created) == 1 and outcomes.count("duplicate") == 15, outcomes
    loaded_name = unique("race-load")
    loaded = race(loaded_name, True)
    assert len(set(loaded)) == 1 and "duplicate" not in loaded, loaded
    for n, study_id in [(name, created[0]), (loaded_name, loaded[0])]:
        status, page = server.call("GET", f"/v1/studies?name={n}", tokens["reader"])
        assert status == 200, page
        assert [s["id"] for s in page["studies"] if s["name"] == n] == [study_id]


def test_get_trials_sends_only_what_the_cache_asks_for(storage: TokenStorageProxy) -> None:
    study_id = storage.create_new_study([StudyDirection.MINIMIZE], unique("incremental"))
    ids = [storage.create_new_trial(study_id) for _ in range(4)]
    storage.set_trial_state_values(ids[0], TrialState.COMPLETE, [1.0])
    storage.set_trial_state_values(ids[1], TrialState.COMPLETE, [2.0])
    stub = storage._stub
    every = stub.GetTrials(api_pb2.GetTrialsRequest(study_id=study_id, trial_id_greater_than=-1))
    assert [t.trial_id for t in every.trials] == ids
    newer = stub.GetTrials(api_pb2.GetTrialsRequest(
        study_id=study_id, included_trial_ids=[ids[2]], trial_id_greater_than=ids[2]))
    assert [t.trial_id for t in newer.trials] == [ids[2], ids[3]]
    none_newer = stub.GetTrials(api_pb2.GetTrialsRequest(
        study_id=study_id, included_trial_ids=[ids[0]], trial_id_greater_than=ids[3]))
    assert [t.trial_id for t in none_newer.trials] == [ids[0]]


# Whole studies -------------------------------------------------------------------------------

@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_a_seeded_study_equals_optunas_in_memory_storage(storage: TokenStorageProxy, sampler: str) -> None:
    def run(store: Any) -> optuna.Study:
        make = optuna.samplers.TPESampler if sampler == "tpe" else optuna.samplers.RandomSampler
        study = optuna.create_study(study_name=unique("seeded"), storage=store,
                                    sampler=make(seed=7))
        study.optimize(objective, n_trials=25)
        return study

    ours, theirs = run(storage), run(optuna.storages.InMemoryStorage())
    assert summary(ours) == summary(theirs)
    assert ours.best_params == theirs.best_params
    assert ours.best_value == theirs.best_value


def test_pruned_trials_equal_optunas_in_memory_storage(storage: TokenStorageProxy) -> None:
    def run(store: Any) -> optuna.Study:
        study = optuna.create_study(storage=store, study_name=unique("pruned"),
                                    sampler=optuna.samplers.TPESampler(seed=3),
                                    pruner=optuna.pruners.MedianPruner(n_startup_trials=3))
        study.optimize(pruned_objective, n_trials=20)
        return study

    ours, theirs = run(storage), run(optuna.storages.InMemoryStorage())
    assert summary(ours) == summary(theirs)
    assert TrialState.PRUNED in {t.state for t in ours.trials}


def test_multi_objective_study_equals_in_memory(storage: TokenStorageProxy) -> None:
    def two(trial: optuna.Trial) -> Any:
        x = trial.suggest_float("x", 0, 5)
        y = trial.suggest_float("y", 0, 3)
        return 4 * x * x + 4 * y * y, (x - 5) ** 2 + (y - 5) ** 2

    def run(store: Any) -> optuna.Study:
        study = optuna.create_study(storage=store, study_name=unique("multi"),
                                    directions=["minimize", "minimize"],
                                    sampler=optuna.samplers.NSGAIISampler(seed=11, population_size=6))
        study.optimize(two, n_trials=18)
        return study

    ours, theirs = run(storage), run(optuna.storages.InMemoryStorage())
    assert ours.directions == [StudyDirection.MINIMIZE, StudyDirection.MINIMIZE]
    assert summary(ours) == summary(theirs)
    assert [t.number for t in ours.best_trials] == [t.number for t in theirs.best_trials]


def test_enqueued_trials_wait_then_run_with_their_parameters(storage: TokenStorageProxy) -> None:
    study = optuna.create_study(study_name=unique("enqueue"), storage=storage)
    study.enqueue_trial({"x": 1.5, "lr": 0.01, "n": 2, "kind": "b"}, user_attrs={"why": "seed"})
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs == {"why": "seed"}
    assert waiting[0].datetime_start is None
    study.optimize(objective, n_trials=2)
    first = study.trials[0]
    assert first.state == TrialState.COMPLETE
    assert first.params == {"x": 1.5, "lr": 0.01, "n": 2, "kind": "b"}
    study.add_trial(optuna.trial.create_trial(
        params={"x": 0.0}, distributions={"x": FloatDistribution(-10, 10)}, value=4.0,
        intermediate_values={1: 5.0}, user_attrs={"added": True}))
    added = study.trials[-1]
    assert (added.state, added.value, added.params, added.intermediate_values) == (
        TrialState.COMPLETE, 4.0, {"x": 0.0}, {1: 5.0})


def _work(port: int, token: str, name: str, n_trials: int) -> None:
    storage = TokenStorageProxy(host="127.0.0.1", port=port, token=token)
    study = optuna.load_study(study_name=name, storage=storage)
    study.optimize(objective, n_trials=n_trials)


def test_several_processes_share_one_study(server: Server, tokens: Dict[str, str],
                                           storage: TokenStorageProxy) -> None:
    name = unique("parallel")
    study = optuna.create_study(study_name=name, storage=storage)
    for i in range(6):
        study.enqueue_trial({"x": float(i), "lr": 0.001, "n": 1, "kind": "a"})
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_work, args=(server.grpc_port, tokens["writer"], name, 8))
               for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(300)
        assert w.exitcode == 0
    trials = optuna.load_study(study_name=name, storage=storage).trials
    assert sorted(t.number for t in trials) == list(range(32))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    # Each enqueued trial ran once, by one worker.
    enqueued = sorted(t.params["x"] for t in trials if t.params["lr"] == 0.001 and t.params["n"] == 1
                      and t.params["kind"] == "a" and float(t.params["x"]).is_integer())
    assert enqueued == [float(i) for i in range(6)]


def test_two_replicas_on_one_database_share_a_study(server: Server, replica: Server,
                                                   tokens: Dict[str, str],
                                                   storage: TokenStorageProxy) -> None:
    name = unique("replicas")
    study = optuna.create_study(study_name=name, storage=storage)
    for i in range(8):
        study.enqueue_trial({"x": float(i), "lr": 0.001, "n": 1, "kind": "a"})
    context = multiprocessing.get_context("spawn")
    ports = [server.grpc_port, replica.grpc_port] * 2
    workers = [context.Process(target=_work, args=(port, tokens["writer"], name, 5))
               for port in ports]
    for w in workers:
        w.start()
    for w in workers:
        w.join(300)
        assert w.exitcode == 0
    trials = optuna.load_study(study_name=name, storage=storage).trials
    assert sorted(t.number for t in trials) == list(range(20))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    enqueued = sorted(t.params["x"] for t in trials if t.params["lr"] == 0.001 and t.params["n"] == 1
                      and t.params["kind"] == "a" and float(t.params["x"]).is_integer())
    assert enqueued == [float(i) for i in range(8)]


def test_an_optuna_study_is_an_augur_study(server: Server, tokens: Dict[str, str],
                                          storage: TokenStorageProxy) -> None:
    name = unique("visible")
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    study_id = storage.get_study_id_from_name(name)
    status, body = server.call("GET", f"/v1/studies/{study_id}", tokens["reader"])
    assert status == 200, body
    assert body["name"] == name
    assert body["spec"]["metrics"] == [{"id": "value", "goal": "maximize"}]
    assert body["trial_counts"]["completed"] == 3
    status, page = server.call("GET", f"/v1/studies/{study_id}/trials", tokens["reader"])
    assert status == 200, page
    values = sorted(t["final_measurement"]["metrics"]["value"] for t in page["trials"])
    assert values == sorted(t.value for t in study.trials)
    assert all("x" in t["parameters"] for t in page["trials"])


def test_unchanged_code_works_on_an_open_server(open_server: Server) -> None:
    storage = GrpcStorageProxy(host="127.0.0.1", port=open_server.grpc_port)
    study = optuna.create_study(study_name="plain", storage=storage,
                                sampler=optuna.samplers.TPESampler(seed=1))
    study.optimize(objective, n_trials=12)
    reference = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=1))
    reference.optimize(objective, n_trials=12)
    assert summary(study) == summary(reference)
