#!/usr/bin/env python3
"""An ask/tell worker with only the Python standard library.

Asks Augur for a trial, "trains" (a synthetic loss curve whose optimum is known: learning
rate 0.01, l2 1e-4, depth 3, adam), reports a measurement per epoch, asks whether to stop
early, completes the trial, and repeats until the study is done.

    python3 examples/ask-tell/worker.py --study 1 [--url http://127.0.0.1:8080] [--client w1]
"""
import argparse
import json
import math
import os
import time
import urllib.error
import urllib.request


def call(url, method, path, body=None, token=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("content-type", "application/json")
    if token:
        req.add_header("authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            text = resp.read().decode()
            return json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {path}: {e.code} {e.read().decode()}")


def loss_at(params, epoch):
    """A learning curve that decays towards a final loss set by the hyperparameters."""
    lr, l2, depth = params["learning_rate"], params["l2"], params["depth"]
    final = (math.log10(lr) + 2) ** 2 + 0.3 * (math.log10(l2) + 4) ** 2 + 0.2 * (depth - 3) ** 2
    if params["optimizer"] == "sgd":
        final += 0.5 * (1 - params.get("momentum", 0.0))
    return final + 2.0 * math.exp(-0.5 * epoch)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--study", type=int, required=True)
    ap.add_argument("--url", default=os.environ.get("AUGUR_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--client", default="worker-%d" % os.getpid())
    ap.add_argument("--epochs", type=int, default=10)
    args = ap.parse_args()
    token = os.environ.get("AUGUR_TOKEN")
    s = args.study
    while True:
        answer = call(args.url, "POST", f"/v1/studies/{s}/suggest", {"count": 1, "client_id": args.client}, token)
        if not answer["trials"]:
            if answer.get("retry_after_secs") is None:
                print(f"study {s} is {answer['study_state']}")
                break
            time.sleep(answer["retry_after_secs"])
            continue
        trial = answer["trials"][0]
        t, params = trial["id"], trial["parameters"]
        stopped = False
        for epoch in range(1, args.epochs + 1):
            loss = loss_at(params, epoch)
            call(args.url, "POST", f"/v1/studies/{s}/trials/{t}/measurements",
                 {"step": epoch, "metrics": {"loss": loss}}, token)
            if call(args.url, "GET", f"/v1/studies/{s}/trials/{t}/should_stop", None, token)["should_stop"]:
                stopped = True
                break
        done = call(args.url, "POST", f"/v1/studies/{s}/trials/{t}/complete", {}, token)
        note = " (stopped early)" if stopped else ""
        print(f"trial {t}: loss {done['final_measurement']['metrics']['loss']:.4f}{note} {params}")
    best = call(args.url, "GET", f"/v1/studies/{s}/optimal_trials", None, token)["trials"]
    if best:
        print("best:", best[0]["id"], best[0]["parameters"], best[0]["final_measurement"]["metrics"])


if __name__ == "__main__":
    main()
