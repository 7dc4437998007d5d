#!/usr/bin/env python3
"""An ask/tell worker on Augur's Python client (clients/python).

Asks Augur for a trial, "trains" (a synthetic loss curve whose optimum is known: learning
rate 0.01, l2 1e-4, depth 3, adam), reports a measurement per epoch, asks whether to stop
early, completes the trial, and repeats until the study is done. While it trains, the client
renews the trial's lease in the background; an exception fails the trial.

    python3 examples/ask-tell/worker.py --study ask-tell-quickstart [--url …] [--client w1]

`--study` takes the study's id or its name (the one active study of that name).

It runs from a fresh checkout (the client is taken from clients/python/src when it is not
installed; it needs httpx: `pip install httpx`, or `pip install -e clients/python`). A worker
restarted with the same --client resumes the trials it held.
"""
import argparse
import math
import os
import sys

try:
    import augur
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "clients", "python", "src"))
    try:
        import augur
    except ImportError as e:
        sys.exit(f"{e}: the Python client needs httpx: pip install httpx "
                 "(or pip install -e clients/python)")


def loss_at(params, epoch):
    """A learning curve that decays towards a final loss set by the hyperparameters."""
    lr, l2, depth = params["learning_rate"], params["l2"], params["depth"]
    final = (math.log10(lr) + 2) ** 2 + 0.3 * (math.log10(l2) + 4) ** 2 + 0.2 * (depth - 3) ** 2
    if params["optimizer"] == "sgd":
        final += 0.5 * (1 - params.get("momentum", 0.0))
    return final + 2.0 * math.exp(-0.5 * epoch)


def find_study(client, study):
    """The study with this id, or the one active study with this name."""
    if study.isdigit():
        return client.study(int(study))
    named = [s for s in client.studies(state="active", name=study) if s.name == study]
    if len(named) != 1:
        ids = ", ".join(str(s.id) for s in named)
        sys.exit(f"{len(named)} active studies are named {study!r}{': ' + ids if ids else ''}: "
                 "give its id (augur study list)")
    return named[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--study", required=True, help="the study's id or name")
    ap.add_argument("--url", default=os.environ.get("AUGUR_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--client", default="worker-%d" % os.getpid())
    ap.add_argument("--epochs", type=int, default=10)
    args = ap.parse_args()
    with augur.Client(args.url) as client:  # the token, if any, from $AUGUR_TOKEN
        study = find_study(client, args.study)
        for trial in study.work(args.client):  # waits while the cap is full; ends with the study
            with trial:  # completes from the measurements on exit; an exception fails it
                for epoch in range(1, args.epochs + 1):
                    trial.report(epoch, {"loss": loss_at(trial.parameters, epoch)})
                    if trial.should_stop():
                        break
            note = " (stopped early)" if trial.data.get("early_stopped") else ""
            print(f"trial {trial.id}: loss {trial.metrics['loss']:.4f}{note} {trial.parameters}")
        print(f"study {study.id} is {study.refresh().state}")
        best = study.best()
        if best:
            print("best:", best.id, best.parameters, best.metrics)


if __name__ == "__main__":
    main()
