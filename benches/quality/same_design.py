"""Optuna's GPSampler started from gp_bandit's own initial design: is a study's fate decided
by its initial points or by what the model does after them?

Reads the JSON lines of `examples/quality.rs --points` (box functions), and for each study
enqueues its first k points in a GPSampler study (`n_startup_trials=k`), then lets GPSampler
run to the budget with the same protocol as reference.py (a batch: k asks before any tell).
k is the size of gp_bandit's quasi-random design, which the quality driver records with
the points (`"initial"`, in whole batches). Prints reference.py's JSON lines with optimizer `optuna_gp_same_design`, for report.py.

The converse, gp_bandit started from GPSampler's own start-up design (its first 10 trials,
random points from its seed): `--gp-designs FUNCTION FIRST_SEED SEEDS` prints them in the
form of `examples/quality.rs --designs`.

    target/release/examples/quality --seeds 30 --functions hartmann6 --algorithms gp_bandit \
        --parallel 1 --points > h6.jsonl
    python benches/quality/same_design.py h6.jsonl > h6_same.jsonl
    python benches/quality/report.py h6.jsonl h6_same.jsonl
    python benches/quality/same_design.py --gp-designs hartmann6 0 30 > gp_designs.jsonl
    target/release/examples/quality --seeds 30 --functions hartmann6 --algorithms gp_bandit \
        --parallel 1 --gp max_initial_trials=10 --designs gp_designs.jsonl
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import SUITE, optuna_loop, optuna_params, regret_of  # noqa: E402


def run(row):
    import optuna
    import torch

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space, f, fstar, budget = SUITE[row["function"]]
    parallel, seed = row["parallel"], row["seed"]
    k = row["initial"]
    # As reference.py's GPSampler, with gp_bandit's design as its start-up trials.
    sampler = optuna.samplers.GPSampler(seed=seed, n_startup_trials=k)
    study = optuna.create_study(sampler=sampler)
    for x in row["x"][:k]:
        study.enqueue_trial({p["id"]: v for p, v in zip(space, x)})
    ys, ms = optuna_loop(study, space, f, budget, parallel)
    return {"optimizer": "optuna_gp_same_design", "function": row["function"],
            "parallel": parallel, "seed": seed, "regret": regret_of(ys, fstar), "ms": ms}


def gp_designs(name, first_seed, seeds):
    """GPSampler's start-up trials (random until it has 10) for seeds first..first+seeds."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = SUITE[name][0]
    for seed in range(first_seed, first_seed + seeds):
        study = optuna.create_study(sampler=optuna.samplers.GPSampler(seed=seed))
        points = []
        for _ in range(10):
            trial = study.ask()
            a = optuna_params(trial, space)
            points.append([a[p["id"]] for p in space])
            study.tell(trial, 0.0)  # the start-up sampler does not look at values
        print(json.dumps({"function": name, "seed": seed, "x": points}), flush=True)


def main():
    if sys.argv[1:2] == ["--gp-designs"]:
        name, first, count = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        return gp_designs(name, first, count)
    for path in sys.argv[1:]:
        with open(path) as lines:
            for line in lines:
                row = json.loads(line)
                if "x" in row and "initial" in row and row["function"] in SUITE:
                    print(json.dumps(run(row)), flush=True)


if __name__ == "__main__":
    main()
