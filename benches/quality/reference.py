"""Reference optimizers for Augur's quality bench, same protocol as examples/quality.rs.

Prints one JSON line per study: {"optimizer", "function", "parallel", "seed",
"regret": [best-so-far simple regret per trial], "ms": [wall ms per suggestion]}.
Usage: reference.py --optimizers optuna_tpe,optuna_gp,botorch_qlognei --functions all
       --seeds 10 --slow-seeds 5 --parallel 1,5
       reference.py --self-test   (the shared agreement points, see test_functions.rs)

Every problem is a search space (list of parameter dicts, the same as Augur's spec:
double/int/cat, log scale, conditional on a parent's value) and an objective over a dict of
active parameter values, defined identically in crates/augur-optimizer/src/test_functions.rs.
"""
import argparse
import os

# One thread per process: the bench measures one core, and torch's thread pool spins
# badly on a shared 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import json
import math
import sys
import time



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


def box(f, bounds):
    """A box problem: doubles x0..x{d-1}."""
    space = [{"id": f"x{i}", "type": "double", "lo": lo, "hi": hi} for i, (lo, hi) in enumerate(bounds)]
    return space, (lambda a: f([a[f"x{i}"] for i in range(len(bounds))]))


def train5(a):
    opt = a["optimizer"]
    if opt == "sgd":
        m = a["momentum"]
        base, lstar, bstar = -0.1 + 0.6 * (m - 0.9) ** 2, -1.2 + math.log10(1.0 - m), 8.4
    elif opt == "adam":
        base, lstar, bstar = 0.0, -3.3, 6.3
    else:
        base, lstar, bstar = 0.15, -2.8, 7.0
    return (base + 0.6 * (math.log10(a["lr"]) - lstar) ** 2 + 0.05 * (math.log2(a["batch"]) - bstar) ** 2
            + 1.5 * (a["dropout"] - 0.25) ** 2 + 0.02 * (a["layers"] - 3.6) ** 2)


TRAIN5_SPACE = [
    {"id": "lr", "type": "double", "lo": 1e-5, "hi": 1.0, "log": True},
    {"id": "batch", "type": "int", "lo": 16, "hi": 1024, "log": True},
    {"id": "optimizer", "type": "cat", "choices": ["sgd", "adam", "rmsprop"]},
    {"id": "momentum", "type": "double", "lo": 0.0, "hi": 0.99, "parent": ("optimizer", "sgd")},
    {"id": "dropout", "type": "double", "lo": 0.0, "hi": 0.8},
    {"id": "layers", "type": "int", "lo": 1, "hi": 8},
]

ACKLEY_SHIFTS = {"a": -2.0, "b": 3.3, "c": 6.0, "d": 0.5}
ACKLEY_OFFSETS = {"a": 0.6, "b": 0.0, "c": 0.3, "d": 0.9}


def ackley_mixed(a):
    s = ACKLEY_SHIFTS[a["level"]]
    return ackley([a[k] - s for k in ("x0", "x1", "x2", "n0", "n1")]) + ACKLEY_OFFSETS[a["level"]]


ACKLEY_MIXED_SPACE = [
    {"id": "level", "type": "cat", "choices": ["a", "b", "c", "d"]},
    {"id": "x0", "type": "double", "lo": -5.0, "hi": 10.0},
    {"id": "x1", "type": "double", "lo": -5.0, "hi": 10.0},
    {"id": "x2", "type": "double", "lo": -5.0, "hi": 10.0},
    {"id": "n0", "type": "int", "lo": -5, "hi": 10},
    {"id": "n1", "type": "int", "lo": -5, "hi": 10},
]

# name: (space, f, f*, budget) -- the same table as crates/augur-optimizer/src/test_functions.rs
SUITE = {
    "branin": (*box(branin, [(-5.0, 10.0), (0.0, 15.0)]), 0.397887357729738, 50),
    "hartmann6": (*box(hartmann6, [(0.0, 1.0)] * 6), -3.32236801141551, 100),
    "rosenbrock4": (*box(rosenbrock, [(-2.0, 2.0)] * 4), 0.0, 50),
    "ackley5": (*box(ackley, [(-5.0, 10.0)] * 5), 0.0, 50),
    "levy10": (*box(levy, [(-10.0, 10.0)] * 10), 0.0, 100),
    "levy10_offcentre": (*box(levy, [(-10.0, 20.0)] * 10), 0.0, 100),
    "rosenbrock6_offcentre": (*box(rosenbrock, [(-3.0, 7.0)] * 6), 0.0, 100),
    "mixed_train5": (TRAIN5_SPACE, train5, None, 50),
    "mixed_ackley6": (ACKLEY_MIXED_SPACE, ackley_mixed, None, 50),
}


def exhaustive_optimum(name):
    """f* of a mixed problem: every discrete combination, continuous part at its minimizer."""
    best = math.inf
    if name == "mixed_train5":
        lstars = {"sgd": -1.2 + math.log10(1 - 0.9), "adam": -3.3, "rmsprop": -2.8}
        for opt, lstar in lstars.items():
            for batch in range(16, 1025):
                for layers in range(1, 9):
                    a = {"optimizer": opt, "lr": 10 ** lstar, "batch": batch, "dropout": 0.25, "layers": layers}
                    if opt == "sgd":
                        a["momentum"] = 0.9
                    best = min(best, train5(a))
    else:
        for level, s in ACKLEY_SHIFTS.items():
            for n0 in range(-5, 11):
                for n1 in range(-5, 11):
                    best = min(best, ackley_mixed({"level": level, "x0": s, "x1": s, "x2": s, "n0": n0, "n1": n1}))
    return best


for _name, (_space, _f, _fstar, _budget) in list(SUITE.items()):
    if _fstar is None:
        SUITE[_name] = (_space, _f, exhaustive_optimum(_name), _budget)

# The points and values that test_functions.rs's AGREEMENT_POINTS also checks (same numbers).
AGREEMENT_POINTS = [
    ("mixed_train5", {"lr": 0.001, "batch": 64, "optimizer": "sgd", "momentum": 0.5, "dropout": 0.1, "layers": 2}, 1.7170966443394742),
    ("mixed_train5", {"lr": 0.0005, "batch": 512, "optimizer": "adam", "dropout": 0.7, "layers": 8}, 1.0554506365346408),
    ("mixed_train5", {"lr": 0.2, "batch": 16, "optimizer": "rmsprop", "dropout": 0.0, "layers": 1}, 3.4775462256078735),
    ("mixed_ackley6", {"level": "b", "x0": 3.3, "x1": 3.3, "x2": 3.3, "n0": 3, "n1": 4}, 2.4250125416488157),
    ("mixed_ackley6", {"level": "a", "x0": 0.0, "x1": -1.5, "x2": 7.25, "n0": -5, "n1": 10}, 16.863527155910973),
    ("levy10_offcentre", {f"x{i}": 5 for i in range(10)}, 73.7266076446214),
]


def active(space, a):
    """Whether each parameter is active given the parent values chosen so far."""
    return [p for p in space if "parent" not in p or a.get(p["parent"][0]) == p["parent"][1]]


def optuna_params(trial, space):
    """Define-by-run: each active parameter in spec order (parents before children)."""
    a = {}
    for p in space:
        if "parent" in p and a.get(p["parent"][0]) != p["parent"][1]:
            continue
        if p["type"] == "double":
            a[p["id"]] = trial.suggest_float(p["id"], p["lo"], p["hi"], log=p.get("log", False))
        elif p["type"] == "int":
            a[p["id"]] = trial.suggest_int(p["id"], p["lo"], p["hi"], log=p.get("log", False))
        else:
            a[p["id"]] = trial.suggest_categorical(p["id"], p["choices"])
    return a


def optuna_loop(study, space, f, budget, parallel):
    """Ask and tell to the budget: values and ms per suggestion."""
    ys, ms = [], []
    while len(ys) < budget:
        k = min(parallel, budget - len(ys))
        trials = []
        # A batch: k asks before any tell (the running trials are pending for the sampler).
        for _ in range(k):
            t0 = time.perf_counter()
            trial = study.ask()
            a = optuna_params(trial, space)
            ms.append((time.perf_counter() - t0) * 1e3)
            trials.append((trial, a))
        for trial, a in trials:
            y = f(a)
            study.tell(trial, y)
            ys.append(y)
    return ys, ms


def regret_of(ys, fstar):
    """Best-so-far simple regret after each value."""
    best, regret = math.inf, []
    for y in ys:
        best = min(best, y)
        regret.append(best - fstar)
    return regret


def run_optuna_with(make_sampler):
    def run(space, f, budget, seed, parallel):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(sampler=make_sampler(seed, parallel))
        return optuna_loop(study, space, f, budget, parallel)

    return run


def tpe(seed, parallel):
    import optuna

    if parallel == 1:
        return optuna.samplers.TPESampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)


def gp_sampler(seed, parallel):
    import optuna

    import torch

    torch.set_num_threads(1)
    return optuna.samplers.GPSampler(seed=seed)


def to_unit(p, v):
    if p.get("log"):
        return (math.log(v) - math.log(p["lo"])) / (math.log(p["hi"]) - math.log(p["lo"]))
    return (v - p["lo"]) / (p["hi"] - p["lo"])


def from_unit(p, u):
    u = min(max(float(u), 0.0), 1.0)
    if p.get("log"):
        v = math.exp(math.log(p["lo"]) + u * (math.log(p["hi"]) - math.log(p["lo"])))
    else:
        v = p["lo"] + u * (p["hi"] - p["lo"])
    if p["type"] == "int":
        return int(min(max(round(v), p["lo"]), p["hi"]))
    return min(max(v, p["lo"]), p["hi"])


def run_botorch(space, f, budget, seed, parallel):
    """BoTorch's textbook loop: Sobol start of max(5, 2d) points, then per batch a GP fitted
    by fit_gpytorch_mll (SingleTaskGP; MixedSingleTaskGP with categorical dims), and
    qLogNoisyExpectedImprovement optimized with q = batch size (optimize_acqf; over every
    categorical combination with optimize_acqf_mixed). Inputs in the unit cube with log
    scaling (categoricals as level indices), integers rounded, outcomes standardized;
    a conditional parameter keeps its coordinate and is ignored while inactive."""
    import itertools
    import warnings

    import torch
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import MixedSingleTaskGP, SingleTaskGP
    from botorch.models.transforms.outcome import Standardize
    from botorch.optim import optimize_acqf, optimize_acqf_mixed
    from gpytorch.mlls import ExactMarginalLogLikelihood
    from torch.quasirandom import SobolEngine

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    d = len(space)
    cat_dims = [i for i, p in enumerate(space) if p["type"] == "cat"]
    upper = [len(p["choices"]) - 1.0 if p["type"] == "cat" else 1.0 for p in space]
    bounds = torch.tensor([[0.0] * d, upper], dtype=torch.double)

    def snap(u):
        """Feasible point of a raw vector: rounded integers and category indices."""
        out, a = [], {}
        for p, v in zip(space, u):
            v = float(v)
            if p["type"] == "cat":
                i = int(min(max(round(v), 0), len(p["choices"]) - 1))
                out.append(float(i))
                a[p["id"]] = p["choices"][i]
            else:
                x = from_unit(p, v)
                out.append(to_unit(p, x) if p["type"] == "int" else min(max(v, 0.0), 1.0))
                a[p["id"]] = x
        act = {p["id"] for p in active(space, a)}
        return out, {k: v for k, v in a.items() if k in act}

    n0 = max(5, 2 * d)
    sobol = SobolEngine(d, scramble=True, seed=seed).draw(n0, dtype=torch.double)
    X, ys, ms = [], [], []
    while len(ys) < budget:
        k = min(parallel, budget - len(ys))
        t0 = time.perf_counter()
        if len(ys) < n0:
            k = min(k, n0 - len(ys))
            raw = [[u * (upper[j] + 1 if space[j]["type"] == "cat" else 1) for j, u in enumerate(row.tolist())]
                   for row in sobol[len(ys):len(ys) + k]]
            raw = [[min(v, upper[j]) if space[j]["type"] == "cat" else v for j, v in enumerate(r)] for r in raw]
            raw = [[math.floor(v) if space[j]["type"] == "cat" else v for j, v in enumerate(r)] for r in raw]
        else:
            tx = torch.tensor(X, dtype=torch.double)
            ty = -torch.tensor(ys, dtype=torch.double).unsqueeze(-1)
            if cat_dims:
                model = MixedSingleTaskGP(tx, ty, cat_dims=cat_dims, outcome_transform=Standardize(m=1))
            else:
                model = SingleTaskGP(tx, ty, outcome_transform=Standardize(m=1))
            fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
            acq = qLogNoisyExpectedImprovement(model, X_baseline=tx, prune_baseline=True)
            if cat_dims:
                combos = itertools.product(*[range(len(space[i]["choices"])) for i in cat_dims])
                fixed = [dict(zip(cat_dims, map(float, c))) for c in combos]
                cand, _ = optimize_acqf_mixed(acq, bounds=bounds, q=k, num_restarts=5, raw_samples=256,
                                              fixed_features_list=fixed)
            else:
                cand, _ = optimize_acqf(acq, bounds=bounds, q=k, num_restarts=10, raw_samples=512)
            raw = cand.tolist()
        per = (time.perf_counter() - t0) * 1e3 / k
        for r in raw:
            u, a = snap(r)
            X.append(u)
            ys.append(f(a))
            ms.append(per)
    return ys, ms


def run_skopt(space, f, budget, seed, parallel):
    from skopt import Optimizer

    bounds = [(p["lo"], p["hi"]) for p in space]
    opt = Optimizer(bounds, base_estimator="GP", acq_func="EI", random_state=seed)
    ys, ms = [], []
    while len(ys) < budget:
        k = min(parallel, budget - len(ys))
        t0 = time.perf_counter()
        xs = opt.ask() if k == 1 else opt.ask(n_points=k)
        xs = [xs] if k == 1 else xs
        ask_ms = (time.perf_counter() - t0) * 1e3
        vals = [f({p["id"]: float(v) for p, v in zip(space, x)}) for x in xs]
        # skopt refits its GP in tell(): that is part of the cost of a suggestion.
        t0 = time.perf_counter()
        opt.tell([list(map(float, x)) for x in xs], vals)
        per = (ask_ms + (time.perf_counter() - t0) * 1e3) / k
        ys.extend(vals)
        ms.extend([per] * k)
    return ys, ms


def run_random(space, f, budget, seed, parallel):
    import random

    rng = random.Random(seed)
    ys = []
    for _ in range(budget):
        a = {}
        for p in space:
            if "parent" in p and a.get(p["parent"][0]) != p["parent"][1]:
                continue
            a[p["id"]] = rng.choice(p["choices"]) if p["type"] == "cat" else from_unit(p, rng.random())
        ys.append(f(a))
    return ys, [0.0] * budget


RUNNERS = {
    "optuna_tpe": run_optuna_with(tpe),
    "optuna_gp": run_optuna_with(gp_sampler),
    "botorch_qlognei": run_botorch,
    "skopt_gp_ei": run_skopt,
    "py_random": run_random,
}
# Slow references run --slow-seeds seeds; skopt only on box problems (all doubles).
SLOW = {"botorch_qlognei", "skopt_gp_ei"}


def self_test():
    """The agreement points: the values must equal test_functions.rs's AGREEMENT_POINTS."""
    bad = 0
    for name, a, expected in AGREEMENT_POINTS:
        space, f, _fstar, _budget = SUITE[name]
        value = f(a)
        if abs(value - expected) > 1e-9 * max(abs(expected), 1.0):
            print(f"{name} {a}: {value} != {expected}", file=sys.stderr)
            bad += 1
    print(f"self-test: {len(AGREEMENT_POINTS) - bad} passed, {bad} failed", file=sys.stderr)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--optimizers", default="optuna_tpe,optuna_gp,botorch_qlognei")
    ap.add_argument("--functions", default="all")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--slow-seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--parallel", default="1,5")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    funcs = list(SUITE) if a.functions == "all" else a.functions.split(",")
    funcs = [f for f in funcs if f in SUITE]
    for name in funcs:
        space, f, fstar, budget = SUITE[name]
        for opt in a.optimizers.split(","):
            if opt == "skopt_gp_ei" and any(p["type"] != "double" for p in space):
                continue
            seeds = a.slow_seeds if opt in SLOW else a.seeds
            for p in [int(v) for v in a.parallel.split(",")]:
                for seed in range(a.first_seed, a.first_seed + seeds):
                    ys, ms = RUNNERS[opt](space, f, budget, seed, p)
                    line = {"optimizer": opt, "function": name, "parallel": p, "seed": seed,
                            "regret": regret_of(ys, fstar), "ms": ms}
                    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    sys.exit(main())
