"""A trial that Augur dispatches runs Python code that reports with the client and its trial
token, on a server that requires tokens: the token reaches its own trial (should_stop
included, whichever method the server takes) and is refused anything else with
PermissionDenied."""

from __future__ import annotations

import json
import sys
import textwrap
import time

import pytest

import augur
from conftest import Server, unique_name

JOB = textwrap.dedent(
    """
    import json, os
    import augur

    trial = augur.dispatched_trial()
    out = {"parameters": trial.parameters, "state": trial.state}
    trial.report(1, {"loss": 2.0})
    out["should_stop"] = trial.should_stop()
    for name, call in [("other_trial", lambda: trial.study.trial(trial.id + 1)),
                       ("suggest", lambda: trial.study.suggest(1)),
                       ("list_studies", lambda: list(trial.study.client.studies()))]:
        try:
            call()
            out[name] = "allowed"
        except augur.AugurError as e:
            out[name] = [type(e).__name__, e.status, e.code]
    trial.set_user_attr("peak_memory_gb", 1.5)
    try:
        trial.annotate(note="mine")
        out["annotate"] = "allowed"
    except augur.AugurError as e:
        out["annotate"] = [type(e).__name__, e.status, e.code]
    with open(os.path.join(os.environ["AIP_MODEL_DIR"], "model.txt"), "w") as f:
        f.write("trained")
    with open(os.environ["RESULT"], "w") as f:
        json.dump(out, f)
    print("loss=0.5")
    """
)


def test_a_dispatched_trial_reports_with_its_token_and_is_refused_elsewhere(tmp_path):
    token = "augur_test_admin_" + "y" * 24
    server = Server(f"sqlite://{tmp_path / 'dispatch.db'}", tmp_path / "dispatch.log",
                    token=token).start()
    job = tmp_path / "job.py"
    job.write_text(JOB)
    result = tmp_path / "result.json"
    try:
        with augur.Client(server.url, token) as client:
            study = client.create_study({
                "name": unique_name("dispatch"),
                "metrics": [{"id": "loss", "goal": "minimize"}],
                "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
                "max_trials": 1,
                "trial_job": {"executor": "local", "command": [sys.executable, str(job)],
                              "env": {"RESULT": str(result)}, "workdir": str(tmp_path)},
            })
            deadline = time.monotonic() + 90
            while study.refresh().state == "active" and time.monotonic() < deadline:
                time.sleep(0.3)
            trial = study.trial(1)
            assert trial.state == "completed", (trial.data, server.log_path.read_text()[-2000:])
            assert trial.metrics == {"loss": 0.5}
            # Its own token set a user attribute (not a note); its model file is an artifact.
            assert trial.user_attrs == {"peak_memory_gb": 1.5} and trial.note is None
            assert [f["path"] for f in trial.artifacts()] == ["model.txt"]
            assert trial.read_artifact("model.txt") == b"trained"
            with pytest.raises(augur.NotFound):
                trial.read_artifact("nothing.txt")
        out = json.loads(result.read_text())
        assert out["state"] == "active" and set(out["parameters"]) == {"x"}
        assert out["should_stop"] is False
        assert out["other_trial"] == ["PermissionDenied", 403, "permission_denied"]
        assert out["suggest"] == ["PermissionDenied", 403, "permission_denied"]
        assert out["list_studies"] == ["PermissionDenied", 403, "permission_denied"]
        assert out["annotate"] == ["PermissionDenied", 403, "permission_denied"]
    finally:
        server.stop()
