"""Reference optimizers for Augur's multi-fidelity bench (issue 29), same problems and protocol
as crates/augur-optimizer/examples/multi_fidelity.rs.

Optuna's samplers with its pruners, each trial trained epoch by epoch and reporting every
epoch (`trial.report`, `trial.should_prune`), as an Optuna user's objective does:

- optuna_tpe_hyperband: TPESampler + HyperbandPruner(min 1, max 27, reduction factor 3)
- optuna_tpe_asha:      TPESampler + SuccessiveHalvingPruner(min 1, reduction factor 3),
                        Optuna's asynchronous successive halving
- optuna_random_asha:   RandomSampler + SuccessiveHalvingPruner (random + ASHA, Optuna's)

on 4 simulated workers: each worker trains one epoch per time unit (the Rust bench's
attempts also last the epochs they train), new trials start while fewer than `--budget`
epochs (810: the full-budget methods' 30 trials × 27) have been trained, and the running ones
finish. The training itself is the Rust bench's, bit for bit: `multi_fidelity --oracle
PROBLEM` trains each trial on from its checkpoint (Optuna's trials never pause, so each
trains on from its last epoch).

Prints one JSON line per study, as the Rust bench does: {"problem", "method", "seed",
"workers", "trials", "compute", "wall", "attempts": [trials pruned at or reaching epoch 1,
3, 9, 27], "curve": [[compute, wall, best 27-epoch loss], ...]}; give the file to the Rust
bench's `--references` for the table.

Usage: multi_fidelity_reference.py --oracle target/release/examples/multi_fidelity
       [--methods optuna_tpe_hyperband,optuna_tpe_asha,optuna_random_asha]
       [--problems curves_hartmann3,mlp_two_moons] [--seeds 10] [--first-seed 0]
"""
import argparse
import json
import sys

import optuna

from mf_oracle import MAX_EPOCHS, RUNGS, WORKERS, Oracle  # noqa: E402 (beside this script)


def suggest(problem, trial):
    """The Rust bench's search spaces (problems.rs)."""
    if problem == "curves_hartmann3":
        return {f"x{i}": trial.suggest_float(f"x{i}", 0.0, 1.0) for i in range(3)}
    if problem == "mlp_two_moons":
        return {
            "learning_rate": trial.suggest_float("learning_rate", 1e-3, 1.0, log=True),
            "l2": trial.suggest_float("l2", 1e-6, 1e-1, log=True),
            "hidden": trial.suggest_int("hidden", 2, 64, log=True),
        }
    raise SystemExit(f"unknown problem {problem}")


def make_study(problem, method, seed):
    if method == "optuna_tpe_hyperband":
        sampler = optuna.samplers.TPESampler(seed=seed)
        pruner = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=MAX_EPOCHS, reduction_factor=3)
    elif method == "optuna_tpe_asha":
        sampler = optuna.samplers.TPESampler(seed=seed)
        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    elif method == "optuna_random_asha":
        sampler = optuna.samplers.RandomSampler(seed=seed)
        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    else:
        raise SystemExit(f"unknown method {method}")
    # HyperbandPruner puts a trial in a bracket by a hash of the study's name and the trial's
    # number: a named study makes the run repeatable (an unnamed one gets a random name).
    return optuna.create_study(study_name=f"{problem}-{method}-{seed}", direction="minimize",
                               sampler=sampler, pruner=pruner)


def run_study(oracle, problem, method, seed, budget):
    study = make_study(problem, method, seed)
    running = [None] * WORKERS  # (optuna trial, oracle trial, parameters, epochs done)
    clock = trained = trials = 0
    best = float("inf")
    curve = []
    ended_at = {r: 0 for r in RUNGS}
    while True:
        for w in range(WORKERS):
            if running[w] is None and trained < budget:
                t = study.ask()
                running[w] = [t, oracle.new_trial(), suggest(problem, t), 0]
                trials += 1
        if all(r is None for r in running):
            break
        # One time unit: every busy worker trains one epoch.
        losses = {}
        for w, r in enumerate(running):
            if r is not None:
                (loss,) = oracle.train(r[1], r[2], r[3] + 1)
                r[3] += 1
                losses[w] = loss
                trained += 1
        clock += 1
        for w, loss in losses.items():
            t, _, _, epoch = running[w]
            t.report(loss, epoch)
            if epoch >= MAX_EPOCHS:
                study.tell(t, loss)
                best = min(best, loss)
                curve.append([trained, clock, best])
            elif t.should_prune():
                study.tell(t, state=optuna.trial.TrialState.PRUNED)
            else:
                continue
            ended_at[max(r for r in RUNGS if r <= epoch)] += 1
            running[w] = None
    return {
        "problem": problem, "method": method, "seed": seed, "workers": WORKERS,
        "trials": trials, "compute": trained, "wall": clock,
        "attempts": [ended_at[r] for r in RUNGS], "curve": curve,
        "optuna": optuna.__version__,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--oracle", required=True, help="the Rust bench's binary")
    p.add_argument("--methods", default="optuna_tpe_hyperband,optuna_tpe_asha,optuna_random_asha")
    p.add_argument("--problems", default="curves_hartmann3,mlp_two_moons")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=30 * MAX_EPOCHS)
    a = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for problem in a.problems.split(","):
        oracle = Oracle(a.oracle, problem)
        for method in a.methods.split(","):
            for seed in range(a.first_seed, a.first_seed + a.seeds):
                print(json.dumps(run_study(oracle, problem, method, seed, a.budget)), flush=True)
        oracle.close()


if __name__ == "__main__":
    sys.exit(main())
