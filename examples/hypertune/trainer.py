#!/usr/bin/env python3
"""A trainer written for Vertex AI hyperparameter tuning, unchanged for Augur.

It reads its hyperparameters from argparse flags, reports the metric with the real
`cloudml-hypertune` package (which writes to $CLOUD_ML_HP_METRIC_FILE), writes a checkpoint
to $AIP_CHECKPOINT_DIR after every epoch and resumes from it when restarted, and saves the
model to $AIP_MODEL_DIR. The "model" is a 1-D quadratic fitted by gradient descent, so it
runs in a fraction of a second.

Set CRASH_ONCE_AT_EPOCH=N to make the first run die at epoch N (to show that a retried
trial finds its checkpoint).
"""
import argparse
import json
import os
import sys

import hypertune


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--learning_rate", type=float, required=True)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--num_epochs", type=int, default=10)
    args = parser.parse_args()

    ckpt_dir = os.environ["AIP_CHECKPOINT_DIR"]
    os.makedirs(ckpt_dir, exist_ok=True)
    ckpt = os.path.join(ckpt_dir, "state.json")
    state = {"epoch": 0, "w": 5.0, "v": 0.0, "restarts": 0}
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            state = json.load(f)
        state["restarts"] += 1
        print(f"resuming from epoch {state['epoch']}", flush=True)

    crash_at = int(os.environ.get("CRASH_ONCE_AT_EPOCH", "0"))
    hpt = hypertune.HyperTune()
    for epoch in range(state["epoch"] + 1, args.num_epochs + 1):
        # loss(w) = (w - 1)^2, gradient 2 (w - 1), heavy-ball momentum
        state["v"] = args.momentum * state["v"] - args.learning_rate * 2 * (state["w"] - 1)
        state["w"] += state["v"]
        loss = (state["w"] - 1) ** 2
        state["epoch"] = epoch
        with open(ckpt + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(ckpt + ".tmp", ckpt)
        hpt.report_hyperparameter_tuning_metric(
            hyperparameter_metric_tag="loss", metric_value=loss, global_step=epoch)
        if crash_at and epoch == crash_at and state["restarts"] == 0:
            print(f"simulated crash at epoch {epoch}", file=sys.stderr, flush=True)
            os._exit(3)

    os.makedirs(os.environ["AIP_MODEL_DIR"], exist_ok=True)
    with open(os.path.join(os.environ["AIP_MODEL_DIR"], "model.json"), "w") as f:
        json.dump({"w": state["w"], "restarts": state["restarts"]}, f)


if __name__ == "__main__":
    main()
