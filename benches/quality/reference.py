"""Reference optimizers for Augur's quality bench, same protocol as examples/quality.rs.

Prints one JSON line per study: {"optimizer", "function", "parallel", "seed",
"regret": [best-so-far simple regret per trial], "ms": [wall ms per suggestion]}.
Usage: reference.py --optimizers optuna_tpe,skopt_gp_ei --functions all --seeds 10
       --skopt-seeds 3 --parallel 1,5
"""
import argparse
import json
import math
import sys
import time

import numpy as np

PI = math.pi


def branin(x):
    a, b, c = 1.0, 5.1 / (4 * PI**2), 5 / PI
    r, s, t = 6.0, 10.0, 1 / (8 * PI)
    return a * (x[1] - b * x[0] ** 2 + c * x[0] - r) ** 2 + s * (1 - t) * math.cos(x[0]) + s


ALPHA = [1.0, 1.2, 3.0, 3.2]
A = [[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8], [17, 8, 0.05, 10, 0.1, 14]]
P = [[0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886], [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
     [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650], [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381]]


def hartmann6(x):
    return -sum(ALPHA[i] * math.exp(-sum(A[i][j] * (x[j] - P[i][j]) ** 2 for j in range(6))) for i in range(4))


def rosenbrock(x):
    return sum(100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2 for i in range(len(x) - 1))


def ackley(x):
    n = len(x)
    sq = sum(v * v for v in x) / n
    cs = sum(math.cos(2 * PI * v) for v in x) / n
    return -20 * math.exp(-0.2 * math.sqrt(sq)) - math.exp(cs) + 20 + math.e


def levy(x):
    w = [1 + (v - 1) / 4 for v in x]
    mid = sum((wi - 1) ** 2 * (1 + 10 * math.sin(PI * wi + 1) ** 2) for wi in w[:-1])
    return math.sin(PI * w[0]) ** 2 + mid + (w[-1] - 1) ** 2 * (1 + math.sin(2 * PI * w[-1]) ** 2)


# name: (f, bounds, f*, budget) -- the same table as crates/augur-optimizer/src/test_functions.rs
SUITE = {
    "branin": (branin, [(-5.0, 10.0), (0.0, 15.0)], 0.397887357729738, 50),
    "hartmann6": (hartmann6, [(0.0, 1.0)] * 6, -3.32236801141551, 100),
    "rosenbrock4": (rosenbrock, [(-2.0, 2.0)] * 4, 0.0, 50),
    "ackley5": (ackley, [(-5.0, 10.0)] * 5, 0.0, 50),
    "levy10": (levy, [(-10.0, 10.0)] * 10, 0.0, 100),
}


def run_optuna(f, bounds, budget, seed, parallel):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if parallel == 1:
        sampler = optuna.samplers.TPESampler(seed=seed)
    else:
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    study = optuna.create_study(sampler=sampler)
    ys, ms = [], []
    while len(ys) < budget:
        k = min(parallel, budget - len(ys))
        trials = []
        for _ in range(k):
            t0 = time.perf_counter()
            trial = study.ask()
            x = [trial.suggest_float(f"x{i}", lo, hi) for i, (lo, hi) in enumerate(bounds)]
            ms.append((time.perf_counter() - t0) * 1e3)
            trials.append((trial, x))
        for trial, x in trials:
            y = f(x)
            study.tell(trial, y)
            ys.append(y)
    return ys, ms


def run_skopt(f, bounds, budget, seed, parallel):
    from skopt import Optimizer

    opt = Optimizer(bounds, base_estimator="GP", acq_func="EI", random_state=seed)
    ys, ms = [], []
    while len(ys) < budget:
        k = min(parallel, budget - len(ys))
        t0 = time.perf_counter()
        xs = opt.ask() if k == 1 else opt.ask(n_points=k)
        xs = [xs] if k == 1 else xs
        ask_ms = (time.perf_counter() - t0) * 1e3
        vals = [f(list(map(float, x))) for x in xs]
        # skopt refits its GP in tell(): that is part of the cost of a suggestion.
        t0 = time.perf_counter()
        opt.tell([list(map(float, x)) for x in xs], vals)
        per = (ask_ms + (time.perf_counter() - t0) * 1e3) / k
        ys.extend(vals)
        ms.extend([per] * k)
    return ys, ms


def run_random(f, bounds, budget, seed, parallel):
    rng = np.random.default_rng(seed)
    lo = np.array([b[0] for b in bounds])
    hi = np.array([b[1] for b in bounds])
    ys = [f(list(lo + rng.random(len(bounds)) * (hi - lo))) for _ in range(budget)]
    return ys, [0.0] * budget


RUNNERS = {"optuna_tpe": run_optuna, "skopt_gp_ei": run_skopt, "py_random": run_random}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--optimizers", default="optuna_tpe,skopt_gp_ei")
    ap.add_argument("--functions", default="all")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--skopt-seeds", type=int, default=3)
    ap.add_argument("--parallel", default="1,5")
    a = ap.parse_args()
    funcs = list(SUITE) if a.functions == "all" else a.functions.split(",")
    funcs = [f for f in funcs if f in SUITE]
    for name in funcs:
        f, bounds, fstar, budget = SUITE[name]
        for opt in a.optimizers.split(","):
            seeds = a.skopt_seeds if opt.startswith("skopt") else a.seeds
            for p in [int(v) for v in a.parallel.split(",")]:
                for seed in range(seeds):
                    ys, ms = RUNNERS[opt](f, bounds, budget, seed, p)
                    best, regret = math.inf, []
                    for y in ys:
                        best = min(best, y)
                        regret.append(best - fstar)
                    line = {"optimizer": opt, "function": name, "parallel": p, "seed": seed,
                            "regret": regret, "ms": ms}
                    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    sys.exit(main())
