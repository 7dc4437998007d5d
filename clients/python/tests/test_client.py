"""Every method of augur.Client, Study and Trial against a live server."""

from __future__ import annotations

import json
import math
import pickle
import sys
import threading
from pathlib import Path

import httpx
import pytest

import augur
from conftest import REPO, Server, unique_name


def test_create_study_from_a_dict_returns_the_study_with_defaults(client, make_spec):
    spec = make_spec()
    study = client.create_study(spec)
    assert study.id >= 1
    assert study.name == spec["name"]
    assert study.state == "active"
    assert study.spec["trial_lease_secs"] == 600  # a default the server filled in
    assert study.trial_counts["total"] == 0
    assert client.study(study.id).name == spec["name"]


def test_create_study_from_a_yaml_file(client, tmp_path):
    text = (REPO / "examples" / "ask-tell" / "study.yaml").read_text()
    name = unique_name("yaml")
    path = tmp_path / "study.yaml"
    path.write_text(text.replace("name: ask-tell-quickstart", f"name: {name}"))
    study = client.create_study(path)
    assert study.name == name
    assert [p["id"] for p in study.spec["parameters"]] == ["learning_rate", "l2", "depth", "optimizer"]
    assert study.spec["early_stopping"]["rule"] == "median"


def test_create_study_from_a_json_file_path_given_as_str(client, make_spec, tmp_path):
    spec = make_spec()
    path = tmp_path / "study.json"
    path.write_text(json.dumps(spec))
    assert client.create_study(str(path)).name == spec["name"]


def test_a_yaml_spec_without_pyyaml_raises_an_import_error_naming_the_extra(client, tmp_path,
                                                                           monkeypatch):
    path = tmp_path / "study.yaml"
    path.write_text("name: x\n")
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(ImportError, match=r"augur-client\[yaml\]"):
        client.create_study(path)


def test_a_bad_spec_raises_invalid_argument_naming_the_field(client, make_spec):
    spec = make_spec()
    spec["parameters"][1]["min"] = 9
    with pytest.raises(augur.InvalidArgument) as e:
        client.create_study(spec)
    assert e.value.status == 400
    assert e.value.code == "invalid_argument"
    assert e.value.field == "parameters[1].min"
    assert "min" in e.value.message
    assert isinstance(e.value, augur.AugurError)


def test_an_unknown_spec_field_is_named(client, make_spec):
    with pytest.raises(augur.InvalidArgument) as e:
        client.create_study(make_spec(colour="blue"))
    assert e.value.field is not None and "colour" in e.value.field


def test_a_missing_study_raises_not_found(client):
    with pytest.raises(augur.NotFound) as e:
        client.study(987654321)
    assert (e.value.status, e.value.code) == (404, "not_found")


def test_errors_survive_pickling_with_their_details(client):
    with pytest.raises(augur.NotFound) as e:
        client.study(987654321)
    copy = pickle.loads(pickle.dumps(e.value))
    assert type(copy) is augur.NotFound
    assert (copy.status, copy.code, copy.path) == (404, "not_found", "/v1/studies/987654321")


def test_studies_lists_by_name_across_pages(client, make_spec):
    name = unique_name("list")
    ids = [client.create_study(make_spec(name=f"{name}-{i}")).id for i in range(3)]
    found = [s.id for s in client.studies(name=name, page_size=1)]
    assert found == ids
    assert [s.id for s in client.studies(name=name, state="stopped")] == []


def test_suggest_hands_out_at_most_the_cap_then_asks_to_retry(client, make_spec):
    study = client.create_study(make_spec(parallel_trials=2))
    first = study.suggest(3, "w1")
    assert len(first) == 2
    assert all(t.held for t in first)
    assert first.study_state == "active"
    more = study.suggest(1, "w2")
    assert list(more) == [] and more.retry_after_secs is not None and not more.ended
    for t in first:
        t.complete({"loss": 1.0})


def test_suggest_with_the_same_client_id_resumes_the_held_trials(client, make_spec):
    study = client.create_study(make_spec())
    a = study.suggest(1, "worker-a")[0]
    again = study.suggest(1, "worker-a")
    assert [t.id for t in again] == [a.id]
    assert again[0].parameters == a.parameters
    for t in (a, *again):
        t.release()


def test_suggest_without_a_client_id_hands_out_new_trials(client, make_spec):
    study = client.create_study(make_spec())
    one, two = study.suggest()[0], study.suggest()[0]
    assert one.id != two.id
    assert one.data["client_id"] != two.data["client_id"]
    one.release(), two.release()


def test_report_should_stop_and_complete_with_metrics(client, make_spec):
    study = client.create_study(make_spec())
    trial = study.suggest(1, "w")[0]
    assert set(trial.parameters) == {"lr", "depth", "opt"}
    trial.report(1, {"loss": 2.0}, elapsed_secs=0.5)
    trial.report(2, {"loss": 1.5})
    assert [m["step"] for m in trial.measurements] == [1, 2]
    assert trial.should_stop() is False
    trial.complete({"loss": 1.25})
    assert trial.state == "completed" and trial.finished
    assert trial.metrics == {"loss": 1.25}
    assert not trial.held
    assert study.trial(trial.id).final_measurement["metrics"] == {"loss": 1.25}


def test_complete_without_metrics_selects_the_last_measurement(client, make_spec):
    study = client.create_study(make_spec())
    trial = study.suggest(1, "w")[0]
    trial.report(1, {"loss": 3.0})
    trial.report(2, {"loss": 2.5})
    assert trial.complete().metrics == {"loss": 2.5}


def test_complete_as_infeasible(client, make_spec):
    study = client.create_study(make_spec())
    trial = study.suggest(1, "w")[0].complete(infeasible_reason="diverged")
    assert trial.state == "infeasible"
    assert trial.data["infeasible_reason"] == "diverged"


def test_fail_records_the_reason(client, make_spec):
    study = client.create_study(make_spec())
    trial = study.suggest(1, "w")[0].fail("out of memory")
    assert trial.state == "failed" and trial.data["fail_reason"] == "out of memory"
    assert not trial.held


def test_finishing_a_finished_trial_raises_conflict(client, make_spec):
    study = client.create_study(make_spec())
    trial = study.suggest(1, "w")[0].complete({"loss": 1.0})
    with pytest.raises(augur.Conflict) as e:
        study.trial(trial.id).fail("again")
    assert (e.value.status, e.value.code) == (409, "failed_precondition")
    assert augur.FailedPrecondition is augur.Conflict


def test_a_wrong_metric_raises_invalid_argument_with_its_field(client, make_spec):
    study = client.create_study(make_spec())
    trial = study.suggest(1, "w")[0]
    with pytest.raises(augur.InvalidArgument) as e:
        trial.complete({"accuracy": 0.9})
    assert e.value.field is not None and e.value.field.startswith("metrics")
    trial.fail("cleanup")


def test_the_context_manager_completes_the_trial_on_exit(client, make_spec):
    study = client.create_study(make_spec())
    with study.suggest(1, "w")[0] as trial:
        trial.report(1, {"loss": 0.7})
    assert trial.state == "completed" and trial.metrics == {"loss": 0.7}
    assert not trial.held


def test_the_context_manager_leaves_an_explicitly_completed_trial_alone(client, make_spec):
    study = client.create_study(make_spec())
    with study.suggest(1, "w")[0] as trial:
        trial.complete({"loss": 0.3})
    assert study.trial(trial.id).metrics == {"loss": 0.3}


def test_the_context_manager_fails_the_trial_on_an_exception_and_reraises_it(client, make_spec):
    study = client.create_study(make_spec())
    trial = study.suggest(1, "w")[0]
    with pytest.raises(ZeroDivisionError):
        with trial:
            trial.report(1, {"loss": 1.0})
            1 / 0
    stored = study.trial(trial.id)
    assert stored.state == "failed"
    assert "ZeroDivisionError" in stored.data["fail_reason"]
    assert not trial.held


def test_the_context_manager_leaves_an_interrupted_trial_to_resume(client, make_spec):
    study = client.create_study(make_spec())
    trial = study.suggest(1, "resumer")[0]
    with pytest.raises(KeyboardInterrupt):
        with trial:
            raise KeyboardInterrupt
    assert study.trial(trial.id).state == "active"
    assert not trial.held
    resumed = study.suggest(1, "resumer")
    assert [t.id for t in resumed] == [trial.id]
    resumed[0].fail("done")


def test_should_stop_under_the_median_rule_stops_a_poor_trial(client, make_spec):
    study = client.create_study(
        make_spec(early_stopping={"rule": "median", "min_completed_trials": 2})
    )
    for _ in range(2):
        with study.suggest(1, "good")[0] as t:
            for step in range(1, 4):
                t.report(step, {"loss": 1.0 / step})
    poor = study.suggest(1, "poor")[0]
    poor.report(1, {"loss": 50.0})
    poor.report(2, {"loss": 40.0})
    assert poor.should_stop() is True
    assert poor.refresh().state == "stopping"
    poor.complete()
    assert poor.state == "completed" and poor.data["early_stopped"] is True
    # whichever method the server took, the client keeps to it
    assert client._should_stop_methods[0] in augur.SHOULD_STOP_METHODS


def test_should_stop_prefers_post_and_falls_back_to_get(server, make_spec):
    seen = []
    hooks = {"request": [lambda r: seen.append(r.method) if r.url.path.endswith("should_stop") else None]}
    with augur.Client(server.url, http_client=httpx.Client(event_hooks=hooks)) as c:
        study = c.create_study(make_spec())
        trial = study.suggest(1, "w")[0]
        trial.report(1, {"loss": 1.0})
        assert trial.should_stop() is False
        assert trial.should_stop() is False
        trial.fail("done")
    assert seen[0] == "POST"
    if seen[:2] == ["POST", "GET"]:  # the server answers GET only: remembered after one 405
        assert seen == ["POST", "GET", "GET"]
    else:  # the server answers POST
        assert seen == ["POST", "POST"]


def test_add_trial_completed_and_requested(client, make_spec):
    study = client.create_study(make_spec())
    prior = study.add_trial({"lr": 0.01, "depth": 3, "opt": "adam"}, {"loss": 0.5})
    assert prior.state == "completed" and prior.metrics == {"loss": 0.5}
    requested = study.add_trial({"lr": 0.1, "depth": 2, "opt": "sgd"})
    assert requested.state == "requested"
    handed = study.suggest(1, "w")[0]
    assert handed.id == requested.id and handed.parameters["depth"] == 2
    handed.fail("done")
    with pytest.raises(augur.InvalidArgument) as e:
        study.add_trial({"lr": 5.0, "depth": 3, "opt": "adam"}, {"loss": 1.0})
    assert e.value.field == "parameters.lr"


def test_best_and_optimal_trials(client, make_spec):
    study = client.create_study(make_spec())
    assert study.best() is None
    for loss in (3.0, 1.0, 2.0):
        study.suggest(1, "w")[0].complete({"loss": loss})
    best = study.best()
    assert best is not None and best.metrics == {"loss": 1.0}
    assert [t.id for t in study.optimal_trials()] == [best.id]
    assert study.refresh().data["best_trial"]["id"] == best.id


def test_trials_pages_lazily_in_id_order_and_filters_by_state(server, make_spec):
    pages = []
    hooks = {"request": [lambda r: pages.append(r.url.params.get("page_token"))
                         if r.url.path.endswith("/trials") and r.method == "GET" else None]}
    with augur.Client(server.url, http_client=httpx.Client(event_hooks=hooks)) as c:
        study = c.create_study(make_spec(parallel_trials=5))
        for i, t in enumerate(study.suggest(5, "w")):
            if i % 2:
                t.fail("odd")
            else:
                t.complete({"loss": float(i)})
        trials = study.trials(page_size=2)
        first = next(trials)
        assert len(pages) == 1  # nothing fetched beyond the first page yet
        ids = [first.id] + [t.id for t in trials]
        assert ids == sorted(ids) and len(ids) == 5
        assert len(pages) == 3 and pages[0] is None and all(pages[1:])
        assert [t.state for t in study.trials("failed")] == ["failed", "failed"]
        assert not first.held  # listed trials are not held


def test_to_pandas_has_a_row_per_trial(client, make_spec):
    pandas = pytest.importorskip("pandas")
    study = client.create_study(make_spec())
    study.suggest(1, "w")[0].complete({"loss": 0.25})
    study.suggest(1, "w")[0].fail("boom")
    frame = study.to_pandas()
    assert list(frame["id"]) == [1, 2]
    assert list(frame["state"]) == ["completed", "failed"]
    assert frame.loc[0, "metrics_loss"] == 0.25 and pandas.isna(frame.loc[1, "metrics_loss"])
    assert {"params_lr", "params_depth", "params_opt"} <= set(frame.columns)
    assert str(frame["created_at"].dtype).startswith("datetime64")


def test_notes_tags_and_user_attrs_of_studies_and_trials(client, make_spec):
    pandas = pytest.importorskip("pandas")
    study = client.create_study(make_spec())
    study.update(note="first sweep", tags=["baseline", "cpu"])
    assert study.note == "first sweep" and study.tags == ["baseline", "cpu"]
    trial = study.suggest(1, "w")[0]
    trial.set_user_attr("train_loss", 0.3).set_user_attrs({"gpu": "none", "seen": [1, 2]})
    trial.annotate(note="odd curve", tags=["look"])
    trial.complete({"loss": 0.25})
    again = study.trial(trial.id)
    assert again.user_attrs == {"train_loss": 0.3, "gpu": "none", "seen": [1, 2]}
    assert again.note == "odd curve" and again.tags == ["look"]
    again.set_user_attr("gpu", None)  # removes it
    assert "gpu" not in study.trial(trial.id).user_attrs
    frame = study.to_pandas()
    assert frame.loc[0, "user_attrs_train_loss"] == 0.3
    assert frame.loc[0, "tags"] == ["look"] and frame.loc[0, "note"] == "odd curve"
    with pytest.raises(augur.InvalidArgument) as e:
        trial.annotate(tags=[""])
    assert e.value.field == "tags[0]"
    # A finished study takes a note too.
    study.stop()
    assert study.update(note="done").note == "done"


def test_to_pandas_without_pandas_names_the_extra(client, make_spec, monkeypatch):
    study = client.create_study(make_spec())
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"augur-client\[pandas\]"):
        study.to_pandas()


def test_a_failed_study_resumes_only_when_asked(client, make_spec):
    study = client.create_study(make_spec(max_trials=5, max_failed_trials=1))
    study.suggest(1, "w")[0].fail("boom")
    assert study.refresh().state == "failed"
    with pytest.raises(augur.Conflict, match="max_failed_trials"):
        study.resume()
    assert study.update(max_failed_trials=3).state == "failed"  # a PATCH alone does not
    assert study.resume().state == "active"
    assert [t.id for t in study.suggest(1, "w2")] == [2]


def test_add_parameter_grows_the_space_and_fills_in_a_held_trial(client, make_spec):
    study = client.create_study(make_spec())
    held = study.suggest(1, "w")[0]
    momentum = {"id": "momentum", "type": "double", "min": 0, "max": 1}
    parent = {"id": "opt", "values": [held.parameters["opt"]]}
    assert study.add_parameter(momentum, parent, trials={held.id: 0.5}) is study
    children = next(p for p in study.spec["parameters"] if p["id"] == "opt")["children"]
    assert children == [{"when": [held.parameters["opt"]], "parameters": [momentum]}]
    assert held.refresh().parameters["momentum"] == 0.5
    spec = study.spec
    assert study.add_parameter(momentum, parent).spec == spec, "the same again: no change"
    with pytest.raises(augur.Conflict) as e:
        study.add_parameter({**momentum, "max": 2}, parent)
    assert e.value.field == "parameter.max"
    with pytest.raises(augur.InvalidArgument) as e:
        study.add_parameter({"id": "x", "type": "double", "min": 0, "max": 1},
                            {"id": "opt", "values": ["lamb"]})
    assert e.value.field == "parent.values[0]"
    held.complete({"loss": 1.0})
    assert study.suggest(1)[0].parameters.keys() >= {"lr", "depth", "opt"}


def test_update_stop_and_delete(client, make_spec):
    study = client.create_study(make_spec(max_trials=1))
    study.suggest(1, "w")[0].complete({"loss": 1.0})
    assert study.suggest(1, "w").ended
    assert study.refresh().state == "completed"
    assert study.update(max_trials=3).state == "active"
    assert study.spec["max_trials"] == 3
    assert study.stop().state == "stopped"
    ended = study.suggest(1, "w")
    assert ended.ended and ended.study_state == "stopped"
    study.delete()
    with pytest.raises(augur.NotFound):
        study.refresh()
    with pytest.raises(augur.NotFound):
        study.delete()


def test_next_trial_returns_none_once_the_study_ended(client, make_spec):
    study = client.create_study(make_spec(max_trials=1))
    trial = study.next_trial("w")
    assert trial is not None
    assert study.next_trial("other", wait=False) is None  # cap full, not waiting
    trial.complete({"loss": 1.0})
    assert study.next_trial("other") is None


def test_work_runs_a_study_to_the_end_from_several_threads(client, make_spec):
    study = client.create_study(make_spec(max_trials=8, parallel_trials=2))
    done = []

    def worker(name: str) -> None:
        for trial in study.work(name):
            with trial:
                trial.report(1, {"loss": trial.parameters["lr"]})
                done.append(trial.id)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(done) == list(range(1, 9))
    assert study.refresh().state == "completed"
    assert study.trial_counts["completed"] == 8


def test_work_refuses_to_go_on_past_an_unfinished_trial(client, make_spec):
    study = client.create_study(make_spec())
    trials = study.work("lazy")
    first = next(trials)
    with pytest.raises(RuntimeError, match="neither completed nor failed"):
        next(trials)
    first.fail("done")


def test_get_or_create_study_from_many_threads_yields_one_study(client, make_spec):
    spec = make_spec()
    ids = []
    lock = threading.Lock()

    def make() -> None:
        study = client.get_or_create_study(spec)
        with lock:
            ids.append(study.id)

    threads = [threading.Thread(target=make) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(set(ids)) == 1 and len(ids) == 6
    assert [s.id for s in client.studies(name=spec["name"])] == ids[:1]
    assert client.get_or_create_study(spec).id == ids[0]


def test_a_server_with_a_token_refuses_a_client_without_it(tmp_path):
    token = "augur_test_token_" + "x" * 20
    server = Server(f"sqlite://{tmp_path / 'auth.db'}", tmp_path / "auth.log", token=token).start()
    try:
        with augur.Client(server.url, token=None) as anonymous:
            with pytest.raises(augur.Unauthenticated) as e:
                list(anonymous.studies())
            assert (e.value.status, e.value.code) == (401, "unauthenticated")
        with augur.Client(server.url, token=token) as c:
            assert list(c.studies()) == []
    finally:
        server.stop()


def test_the_token_and_url_come_from_the_environment(monkeypatch, server):
    monkeypatch.setenv("AUGUR_URL", server.url)
    monkeypatch.setenv("AUGUR_TOKEN", "anything")  # an open server ignores it
    with augur.Client() as c:
        assert c.url == server.url
        assert c._http._headers["authorization"] == "Bearer anything"
        next(c.studies(), None)


def test_the_package_is_typed():
    assert (Path(augur.__file__).parent / "py.typed").exists()


def test_a_multi_fidelity_trial_pauses_and_comes_back_at_a_larger_budget(client, make_spec):
    spec = make_spec(
        max_trials=3,
        parallel_trials=3,
        fidelity={"argument": "epochs", "min": 1, "max": 9, "reduction_factor": 3},
        scheduler="asha",
    )
    study = client.create_study(spec)
    first = study.suggest(3, "w")
    assert [t.budget for t in first] == [1, 1, 1]
    assert not any(t.resume for t in first)
    assert all("epochs" not in t.parameters for t in first)
    for trial, loss in zip(first, [0.5, 0.2, 0.9]):
        done = trial.complete({"loss": loss})
        assert done.state == "paused" and not done.held, "a paused trial is no longer held"
    promoted = study.suggest(3, "w")
    assert [(t.id, t.budget, t.resume) for t in promoted] == [(first[1].id, 3, True)]
    assert promoted[0].state == "active" and promoted[0].held
    promoted[0].complete({"loss": 0.1})
    top = study.suggest(1, "w")
    assert [(t.id, t.budget) for t in top] == [(first[1].id, 9)]
    assert top[0].complete({"loss": 0.05}).state == "completed"
    assert list(study.suggest(1, "w")) == []
    study.refresh()
    assert study.state == "completed"


def test_a_pbt_segment_names_the_checkpoint_to_copy_and_the_copy_is_reported(client, make_spec):
    spec = make_spec(
        parameters=[{"id": "lr", "type": "double", "min": 0.001, "max": 1.0, "scale": "log"}],
        max_trials=4,
        parallel_trials=2,
        seed=5,
        fidelity={"argument": "epochs", "min": 2, "max": 6},
        scheduler="pbt",
        pbt={"quantile_fraction": 0.25, "resample_probability": 0},
    )
    study = client.create_study(spec)
    checkpoints = {}  # trial id -> (epochs trained, model state)
    copies = []
    for _ in range(40):
        trials = study.suggest(2, "w")
        if not trials:
            if study.refresh().state == "completed":
                break
            continue
        for trial in trials:
            if trial.copying_from is not None:
                checkpoints[trial.id] = checkpoints[trial.copying_from]
                copies.append((trial.id, trial.copying_from, checkpoints[trial.id][0]))
                assert trial.checkpoint_copied().copying_from is None
            epochs, w = checkpoints.get(trial.id, (0, 1.0))
            assert trial.resume == (epochs > 0)
            lr = trial.parameters["lr"]
            for _epoch in range(epochs, trial.budget):
                w *= 1.0 - 0.5 * math.exp(-math.log(lr / 0.3) ** 2 / 2)
            checkpoints[trial.id] = (trial.budget, w)
            trial.complete({"loss": w})
    assert study.refresh().state == "completed"
    assert len(copies) == 2, "the worst of four copies the best at each of two segment ends"
    for copier, parent, at in copies:
        lineage = study.trial(copier).lineage
        assert {"from_budget": at, "parent": parent} in [
            {"from_budget": s["from_budget"], "parent": s.get("parent")} for s in lineage
        ], lineage
