#!/usr/bin/env python3
"""Optuna bridge quality: Optuna code on an Augur study (augur.optuna.AugurSampler) against
Optuna's default sampler (TPE) and random search, at the same budget and parallelism.

For each function and seed, PROCESSES processes each run
``optuna.create_study(sampler=...).optimize(objective, n_trials=budget / PROCESSES, n_jobs=N_JOBS)``
on one shared study: for the bridge, one Augur study found by name (each process keeps its
own in-memory Optuna storage); for TPE and random, one Optuna JournalStorage file. Regret is
the best value found minus the function's optimum. It also checks that the Augur study shows
every trial: as many completed trials as the Optuna processes completed, together.

    benches/quality/optuna_bridge.py                       # branin + hartmann6, 5 seeds, 2x4 jobs
    benches/quality/optuna_bridge.py --functions branin --seeds 0,1 --json

Needs the client's venv (scripts/python-client-test.sh makes target/python-venv) and an
Augur binary: $AUGUR_BIN, else target/release/augur, else target/debug/augur; or --url of a
running server. Prints a markdown table (with --json, one JSON line per run as well).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
try:
    import augur
except ImportError:
    sys.path.insert(0, str(REPO / "clients" / "python" / "src"))
    import augur

PI = math.pi
ALPHA = [1.0, 1.2, 3.0, 3.2]
A = [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8],
     [17, 8, 0.05, 10, 0.1, 14]]
P = [[0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886], [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
     [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650], [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381]]


def branin(x):
    a, b, c = 1.0, 5.1 / (4 * PI**2), 5 / PI
    r, s, t = 6.0, 10.0, 1 / (8 * PI)
    return a * (x[1] - b * x[0] ** 2 + c * x[0] - r) ** 2 + s * (1 - t) * math.cos(x[0]) + s


def hartmann6(x):
    return -sum(ALPHA[i] * math.exp(-sum(A[i][j] * (x[j] - P[i][j]) ** 2 for j in range(6)))
                for i in range(4))


# name: (f, bounds, f*, budget): the same as benches/quality/reference.py
SUITE = {
    "branin": (branin, [(-5.0, 10.0), (0.0, 15.0)], 0.397887357729738, 50),
    "hartmann6": (hartmann6, [(0.0, 1.0)] * 6, -3.32236801141551, 100),
}


def objective_for(function: str):
    f, bounds, _, _ = SUITE[function]

    def objective(trial):
        return f([trial.suggest_float(f"x{i}", lo, hi) for i, (lo, hi) in enumerate(bounds)])

    return objective


# -- one Optuna process ------------------------------------------------------------------------

def worker(args: argparse.Namespace) -> None:
    import optuna
    from augur.optuna import AugurSampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    objective = objective_for(args.function)
    if args.sampler == "augur":
        client = augur.Client(args.url)
        sampler = AugurSampler(
            client, args.study_name, max_trials=args.budget,
            parallel_trials=args.processes * args.n_jobs, seed=args.seed,
            # a loaded 2-core machine must not turn GP suggestions into quasi-random ones
            spec={"suggestion_time_budget_secs": 30},
        )
        study = optuna.create_study(sampler=sampler, direction="minimize")
    else:
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(args.storage))
        seed = args.seed * 100 + args.proc
        sampler = (optuna.samplers.TPESampler(seed=seed) if args.sampler == "tpe"
                   else optuna.samplers.RandomSampler(seed=seed))
        study = optuna.create_study(study_name=args.study_name, storage=storage,
                                    load_if_exists=True, sampler=sampler, direction="minimize")
    mine = []

    def record(study, trial):
        mine.append(trial.state.name)

    study.optimize(objective, n_trials=args.n_trials, n_jobs=args.n_jobs, callbacks=[record])
    print(json.dumps({"states": {s: mine.count(s) for s in set(mine)}}))


# -- the bench -----------------------------------------------------------------------------

def start_server(tmp: Path):
    binary = os.environ.get("AUGUR_BIN")
    if not binary:
        for profile in ("release", "debug"):
            if (REPO / "target" / profile / "augur").exists():
                binary = str(REPO / "target" / profile / "augur")
                break
    if not binary:
        sys.exit("no augur binary: cargo build, or set AUGUR_BIN, or pass --url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp / "serve.log", "ab")
    proc = subprocess.Popen(
        [binary, "serve", "--database-url", f"sqlite://{tmp / 'bench.db'}",
         "--listen", f"127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, AUGUR_LOG="warn"))
    url = f"http://127.0.0.1:{port}"
    import httpx
    for _ in range(600):
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("augur serve did not come up")


def run_one(args, url: str, tmp: Path, function: str, sampler: str, seed: int) -> dict:
    _, _, fstar, budget = SUITE[function]
    name = f"bridge-{function}-{sampler}-{seed}-{uuid.uuid4().hex[:6]}"
    storage = str(tmp / f"{name}.journal")
    per_process = budget // args.processes
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", "--url", url, "--function", function,
             "--sampler", sampler, "--seed", str(seed), "--proc", str(i),
             "--study-name", name, "--n-trials", str(per_process), "--n-jobs", str(args.n_jobs),
             "--processes", str(args.processes), "--budget", str(per_process * args.processes),
             "--storage", storage],
            stdout=subprocess.PIPE, text=True)
        for i in range(args.processes)
    ]
    outputs = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{sampler} worker failed on {function} seed {seed}")
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    seconds = time.monotonic() - started
    optuna_complete = sum(o["states"].get("COMPLETE", 0) for o in outputs)
    result = {"function": function, "sampler": sampler, "seed": seed, "budget": budget,
              "optuna_complete": optuna_complete, "seconds": round(seconds, 1)}
    if sampler == "augur":
        with augur.Client(url) as client:
            study = next(s for s in client.studies(name=name) if s.name == name)
            trials = list(study.trials())
        values = [t.metrics["value"] for t in trials if t.state == "completed"]
        result["augur_trials"] = len(trials)
        result["augur_complete"] = len(values)
        result["augur_study"] = study.id
        result["every_trial_shown"] = len(values) == optuna_complete
    else:
        import optuna
        storage_obj = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(storage))
        study = optuna.load_study(study_name=name, storage=storage_obj)
        values = [t.value for t in study.trials if t.value is not None]
    result["regret"] = min(values) - fstar if values else float("inf")
    return result


def seeds_arg(text: str):
    out = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running Augur server (default: start one on SQLite)")
    ap.add_argument("--functions", default="branin,hartmann6")
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--samplers", default="augur,tpe,random")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--n-jobs", type=int, default=4)
    ap.add_argument("--json", action="store_true", help="also print one JSON line per run")
    # worker mode (one Optuna process)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for flag in ("--function", "--sampler", "--study-name", "--storage"):
        ap.add_argument(flag, help=argparse.SUPPRESS)
    for flag in ("--seed", "--proc", "--n-trials", "--budget"):
        ap.add_argument(flag, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    with tempfile.TemporaryDirectory(prefix="optuna-bridge-") as tmpdir:
        tmp = Path(tmpdir)
        server = None
        url = args.url
        if not url:
            server, url = start_server(tmp)
        try:
            results = []
            for function in args.functions.split(","):
                for sampler in args.samplers.split(","):
                    for seed in seeds_arg(args.seeds):
                        r = run_one(args, url, tmp, function, sampler, seed)
                        results.append(r)
                        if args.json:
                            print(json.dumps(r), flush=True)
                        else:
                            print(f"  {function} {sampler} seed {seed}: regret {r['regret']:.3g} "
                                  f"({r['seconds']} s)", file=sys.stderr, flush=True)
        finally:
            if server:
                server.terminate()
                server.wait()
    print(f"\n{args.processes} processes x n_jobs={args.n_jobs}, one shared study per run; "
          "regret = best value - optimum at the full budget\n")
    print("| function | sampler | budget | seeds | median regret | mean regret | Augur shows every trial |")
    print("|---|---|---|---|---|---|---|")
    for function in args.functions.split(","):
        for sampler in args.samplers.split(","):
            rs = [r for r in results if r["function"] == function and r["sampler"] == sampler]
            regrets = [r["regret"] for r in rs]
            label = {"augur": "AugurSampler (GP bandit)", "tpe": "Optuna default (TPE)",
                     "random": "Optuna RandomSampler"}[sampler]
            shown = "-"
            if sampler == "augur":
                shown = "yes" if all(r["every_trial_shown"] for r in rs) else "NO"
                in_augur = sum(r["augur_complete"] for r in rs)
                shown += f" ({in_augur} of {sum(r['optuna_complete'] for r in rs)})"
            print(f"| {function} | {label} | {SUITE[function][3]} | {len(rs)} | "
                  f"{statistics.median(regrets):.3g} | {statistics.mean(regrets):.3g} | {shown} |")


if __name__ == "__main__":
    main()
