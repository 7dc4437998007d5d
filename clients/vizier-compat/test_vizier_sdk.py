"""The unchanged `google-cloud-aiplatform` SDK (2.7.0) against `augur serve`: the high-level
`aiplatform.vizier.Study`/`Trial` and the generated `VizierServiceClient` (v1 and v1beta1)
over REST, every method, the errors, and the study seen through Augur's own API.

SDK 2.7.0's own bugs are pinned here so that a fixed SDK is noticed: `create_or_load` of a
taken name raises `Conflict` over REST (google-api-core maps HTTP 409 to `Conflict`, the SDK
catches only `AlreadyExists`), and `materialize_study_config()` passes `credentials=` to
`get_study`; its `StudyConfig.from_proto` fails on conditional parameters and its
`to_proto` drops a metric's safety threshold. Conditional parameters and safety thresholds
go through the generated client, which keeps them.
"""

from __future__ import annotations

from typing import Any, Dict

import pytest
from google.api_core import exceptions

from conftest import LOCATION, PROJECT, Server, credentials, unique, vizier_client

PARENT = f"projects/{PROJECT}/locations/{LOCATION}"


def problem() -> Any:
    from google.cloud.aiplatform.vizier import pyvizier as vz

    config = vz.StudyConfig()
    config.metric_information.append(
        vz.MetricInformation(name="acc", goal=vz.ObjectiveMetricGoal.MAXIMIZE))
    root = config.search_space.select_root()
    root.add_float_param("lr", 1e-4, 1.0, scale_type=vz.ScaleType.LOG)
    root.add_int_param("layers", 1, 4)
    root.add_categorical_param("opt", ["adam", "sgd"])
    root.add_discrete_param("batch", [16, 32, 64])
    # A bound of 0 is left out of the proto3 JSON the SDK sends: Augur reads it as 0.
    root.add_float_param("dropout", 0.0, 0.5)
    return config


def test_the_high_level_sdk_tunes_a_study_that_augur_lists(sdk: Any, server: Server,
                                                          tokens: Dict[str, str]) -> None:
    from google.cloud.aiplatform.vizier import Study
    from google.cloud.aiplatform.vizier import pyvizier as vz

    name = unique("sdk")
    study = Study.create_or_load(display_name=name, problem=problem())
    assert study.resource_name.startswith(f"{PARENT}/studies/")
    study_id = int(study.resource_name.rsplit("/", 1)[1])

    trials = study.suggest(count=2, worker="worker-1")
    assert len(trials) == 2
    # The same worker asking again gets its pending trials back, not new ones.
    again = study.suggest(count=2, worker="worker-1")
    assert sorted(t.uid for t in again) == sorted(t.uid for t in trials)
    for i, trial in enumerate(trials):
        params = {k: v.value for k, v in trial.parameters.items()}
        assert 1e-4 <= params["lr"] <= 1.0 and params["opt"] in ("adam", "sgd")
        assert params["batch"] in (16, 32, 64) and 1 <= params["layers"] <= 4
        assert 0.0 <= params["dropout"] <= 0.5
        trial.add_measurement(vz.Measurement(metrics={"acc": 0.1 * (i + 1)}, steps=1))
        assert trial.should_stop() is False
        trial.complete(vz.Measurement(metrics={"acc": 0.5 + 0.1 * i}))
        assert trial.status == vz.TrialStatus.COMPLETED
    best = trials[1]  # it scored higher
    assert [t.uid for t in study.optimal_trials()] == [best.uid]
    assert sorted(t.uid for t in study.trials()) == sorted(t.uid for t in trials)
    assert study.get_trial(best.uid).materialize().final_measurement.metrics["acc"].value == pytest.approx(0.6)

    # The same study through Augur's own API, with what the SDK reported.
    status, seen = server.call("GET", f"/v1/studies/{study_id}", tokens["reader"])
    assert status == 200 and seen["name"] == name, seen
    assert seen["trial_counts"]["completed"] == 2, seen
    assert seen["best_trial"]["id"] == best.uid, seen
    assert seen["user_attrs"]["vertex.project"] == PROJECT, seen

    study.delete()
    status, _ = server.call("GET", f"/v1/studies/{study_id}", tokens["reader"])
    assert status == 404


def test_create_or_load_of_a_taken_name_meets_the_sdks_conflict_bug(sdk: Any, server: Server,
                                                                   tokens: Dict[str, str]) -> None:
    from google.cloud.aiplatform.vizier import Study

    name = unique("again")
    first = Study.create_or_load(display_name=name, problem=problem())
    # Over REST the 409 ALREADY_EXISTS arrives as Conflict, which create_or_load lets through.
    with pytest.raises(exceptions.Conflict) as raised:
        Study.create_or_load(display_name=name, problem=problem())
    assert "ALREADY_EXISTS" in str(raised.value.response.json()["error"]["status"])
    # What create_or_load would do next works: the lookup finds the first study.
    client = vizier_client(server, tokens["writer"])
    found = client.lookup_study(request={"parent": PARENT, "display_name": name})
    assert found.name == first.resource_name
    assert Study(found.name).resource_name == first.resource_name
    first.delete()


def test_materialize_study_config_meets_the_sdks_credentials_bug(sdk: Any, server: Server,
                                                                tokens: Dict[str, str]) -> None:
    from google.cloud.aiplatform.vizier import Study

    study = Study.create_or_load(display_name=unique("config"), problem=problem())
    with pytest.raises(TypeError, match="credentials"):
        study.materialize_study_config()
    # The generated client reads the same spec back.
    client = vizier_client(server, tokens["writer"])
    spec = client.get_study(name=study.resource_name).study_spec
    assert sorted(p.parameter_id for p in spec.parameters) == ["batch", "dropout", "layers",
                                                               "lr", "opt"]
    study.delete()


def test_the_sdks_own_conversions_lose_safety_thresholds_and_conditionals(
        sdk: Any, server: Server, tokens: Dict[str, str]) -> None:
    from google.cloud.aiplatform.vizier import Study
    from google.cloud.aiplatform.vizier import pyvizier as vz

    config = vz.StudyConfig()
    config.metric_information.append(vz.MetricInformation(
        name="acc", goal=vz.ObjectiveMetricGoal.MAXIMIZE, safety_threshold=0.3))
    config.search_space.select_root().add_float_param("x", 0.0, 1.0)
    study = Study.create_or_load(display_name=unique("safety"), problem=config)
    client = vizier_client(server, tokens["writer"])
    sent = client.get_study(name=study.resource_name).study_spec.metrics[0]
    assert not sent.safety_config.safety_threshold, "the SDK sent the threshold: fixed?"
    study.delete()

    spec = conditional_spec()
    spec["metrics"][0]["safety_config"] = {"safety_threshold": 0.5}
    made = client.create_study(parent=PARENT, study={"display_name": unique("cond"),
                                                     "study_spec": spec})
    assert made.study_spec.metrics[0].safety_config.safety_threshold == 0.5
    # The high-level Study still suggests on it; only the SDK's reading of the spec fails.
    trials = Study(made.name).suggest(count=2, worker="w")
    assert len(trials) == 2
    with pytest.raises(AttributeError):
        vz.StudyConfig.from_proto(made.study_spec)
    client.delete_study(name=made.name)


def conditional_spec() -> Dict[str, Any]:
    return {
        "metrics": [{"metric_id": "loss", "goal": "MINIMIZE"}],
        "parameters": [
            {"parameter_id": "x", "double_value_spec": {"min_value": -1.0, "max_value": 1.0}},
            {"parameter_id": "model", "categorical_value_spec": {"values": ["linear", "tree"]},
             "conditional_parameter_specs": [{
                 "parent_categorical_values": {"values": ["tree"]},
                 "parameter_spec": {"parameter_id": "depth",
                                    "integer_value_spec": {"min_value": 2, "max_value": 6}},
             }]},
        ],
        "algorithm": "RANDOM_SEARCH",
    }


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_the_generated_client_serves_every_method(server: Server, tokens: Dict[str, str],
                                                  version: str) -> None:
    client = vizier_client(server, tokens["writer"], version)
    name = unique("gen")
    study = client.create_study(parent=PARENT, study={"display_name": name,
                                                      "study_spec": conditional_spec()})
    assert study.display_name == name and study.state.name == "ACTIVE"
    model = next(p for p in study.study_spec.parameters if p.parameter_id == "model")
    assert model.conditional_parameter_specs[0].parameter_spec.parameter_id == "depth"
    assert client.get_study(name=study.name).display_name == name
    assert client.lookup_study(request={"parent": PARENT, "display_name": name}).name == study.name
    listed = [s.name for s in client.list_studies(parent=PARENT)]
    assert study.name in listed

    operation = client.suggest_trials(request={"parent": study.name, "suggestion_count": 3,
                                               "client_id": "gen-worker"})
    suggested = operation.result().trials
    assert len(suggested) == 3 and all(t.state.name == "ACTIVE" for t in suggested)
    for t in suggested:
        params = {p.parameter_id: p.value for p in t.parameters}
        assert ("depth" in params) == (params["model"] == "tree"), params
    # The operation stays readable by its name.
    again = client.get_operation(request={"name": operation.operation.name})
    assert again.done

    made = client.create_trial(parent=study.name, trial={"parameters": [
        {"parameter_id": "x", "value": 0.25}, {"parameter_id": "model", "value": "linear"}]})
    assert made.state.name == "REQUESTED"
    assert client.get_trial(name=made.name).id == made.id
    assert {t.name for t in client.list_trials(parent=study.name)} >= {made.name}

    first, second, third = suggested
    measured = client.add_trial_measurement(request={
        "trial_name": first.name,
        "measurement": {"step_count": 2, "metrics": [{"metric_id": "loss", "value": 0.9}]}})
    assert measured.measurements[0].step_count == 2
    check = client.check_trial_early_stopping_state(request={"trial_name": first.name})
    assert check.result().should_stop is False
    done = client.complete_trial(request={
        "name": first.name,
        "final_measurement": {"step_count": 3, "metrics": [{"metric_id": "loss", "value": 0.2}]}})
    assert done.state.name == "SUCCEEDED" and done.final_measurement.metrics[0].value == 0.2

    stopped = client.stop_trial(request={"name": second.name})
    assert stopped.state.name == "STOPPING"
    ended = client.complete_trial(request={"name": third.name, "trial_infeasible": True,
                                           "infeasible_reason": "diverged"})
    assert ended.state.name == "INFEASIBLE" and ended.infeasible_reason == "diverged"

    optimal = client.list_optimal_trials(request={"parent": study.name}).optimal_trials
    assert [t.name for t in optimal] == [first.name]

    client.delete_trial(name=made.name)
    with pytest.raises(exceptions.NotFound):
        client.get_trial(name=made.name)
    client.delete_study(name=study.name)
    with pytest.raises(exceptions.NotFound):
        client.get_study(name=study.name)


def test_errors_arrive_as_vertexs(server: Server, tokens: Dict[str, str]) -> None:
    from google.auth.exceptions import RefreshError

    writer = vizier_client(server, tokens["writer"])
    with pytest.raises(exceptions.NotFound):
        writer.get_study(name=f"{PARENT}/studies/999999")
    with pytest.raises(exceptions.NotFound):
        writer.lookup_study(request={"parent": PARENT, "display_name": unique("nobody")})
    bad = conditional_spec()
    bad["parameters"][0]["double_value_spec"]["max_value"] = -2.0
    with pytest.raises(exceptions.BadRequest) as raised:
        writer.create_study(parent=PARENT, study={"display_name": unique("bad"),
                                                  "study_spec": bad})
    assert "parameters[0]" in raised.value.message, raised.value.message
    # A reader may read, not create; a second writer may not change the first one's study.
    reader = vizier_client(server, tokens["reader"])
    with pytest.raises(exceptions.Forbidden):
        reader.create_study(parent=PARENT, study={"display_name": unique("ro"),
                                                  "study_spec": conditional_spec()})
    study = writer.create_study(parent=PARENT, study={"display_name": unique("own"),
                                                      "study_spec": conditional_spec()})
    assert reader.get_study(name=study.name).name == study.name
    with pytest.raises(exceptions.Forbidden):
        vizier_client(server, tokens["writer2"]).suggest_trials(
            request={"parent": study.name, "suggestion_count": 1, "client_id": "w"})
    # An unknown token: google-auth tries to refresh the credentials, and cannot.
    with pytest.raises(RefreshError):
        vizier_client(server, "not-a-token").get_study(name=study.name)
    writer.delete_study(name=study.name)


def test_study_stopping_config_ends_a_study_through_the_generated_client(
        server: Server, tokens: Dict[str, str]) -> None:
    """`studyStoppingConfig` as the generated client writes it (wrapper types, a Duration) is
    kept, read back, and ends the study once a trial makes no progress; a runtime
    constraint is refused naming the field."""
    client = vizier_client(server, tokens["writer"])
    spec = conditional_spec()
    spec["study_stopping_config"] = {"max_num_trials_no_progress": 1,
                                     "max_duration_no_progress": {"seconds": 3600}}
    study = client.create_study(parent=PARENT, study={"display_name": unique("stopping"),
                                                      "study_spec": spec})
    kept = study.study_spec.study_stopping_config
    assert kept.max_num_trials_no_progress == 1
    assert kept.max_duration_no_progress.total_seconds() == 3600
    for loss in (0.2, 0.9):  # loss is minimized: 0.9 makes no progress
        trial = client.suggest_trials(request={"parent": study.name, "suggestion_count": 1,
                                               "client_id": "w"}).result().trials[0]
        client.complete_trial(request={"name": trial.name, "final_measurement": {
            "metrics": [{"metric_id": "loss", "value": loss}]}})
    assert client.get_study(name=study.name).state.name == "COMPLETED"
    bad = conditional_spec()
    bad["study_stopping_config"] = {"maximum_runtime_constraint": {
        "max_duration": {"seconds": 60}}}
    with pytest.raises(exceptions.BadRequest) as raised:
        client.create_study(parent=PARENT, study={"display_name": unique("runtime"),
                                                  "study_spec": bad})
    assert "studyStoppingConfig.maximumRuntimeConstraint" in raised.value.message
    client.delete_study(name=study.name)
