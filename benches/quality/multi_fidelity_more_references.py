"""Ray Tune and Syne Tune references for Augur's multi-fidelity bench (issue 29): the same
problems, oracle and protocol as multi_fidelity_reference.py's Optuna references.

Methods (each library's own scheduler makes every decision; this script is only its clock):

- ray_random_asha:  Ray Tune's ASHAScheduler (AsyncHyperBandScheduler: time_attr
                    training_iteration, grace_period 1, max_t 27, reduction_factor 3, one
                    bracket) with random search (Ray's own search-space domains sampled from a
                    seeded RandomState, as its BasicVariantGenerator samples them)
- syne_asha:        Syne Tune's ASHA (HyperbandScheduler, random searcher; grace_period 1,
                    max_t 27, reduction_factor 3, its default type "stopping")
- syne_mobster:     Syne Tune's MOBSTER (HyperbandScheduler with the "bayesopt" searcher, its
                    default "gp_multitask" surrogate over configuration × epochs; same rungs,
                    type "stopping")
- syne_asha_promotion, syne_mobster_promotion: the same with type "promotion" (trials pause at
                    a rung and are resumed from their checkpoint when promoted, as Augur's ASHA
                    does; max_resource_attr "epochs" = 27)

Protocol, as the Optuna references: 4 simulated workers, each training one epoch per time
unit; whenever a worker is free and fewer than `--budget` epochs (810: the full-budget methods'
30 trials × 27) have been trained, the scheduler is asked for a trial (a new one or, under
"promotion", a paused one to resume); the running ones finish. Every epoch's loss is reported
to the scheduler as its tuner would (Ray: `on_trial_result`, and on STOP `on_trial_complete`
with the last result, as TuneController does; Syne: `on_trial_result`, on STOP
`on_trial_remove`, on PAUSE `on_trial_remove`, and `on_trial_complete` when a trial ends at 27
epochs, as syne_tune.Tuner does). The training is the Rust bench's, bit for bit:
`multi_fidelity --oracle PROBLEM` trains each trial on from its checkpoint.

Departures: neither library's own runtime runs the trials. Ray's `tune.Tuner` would run each
trial as an actor in real time and Syne Tune's simulator backend needs a tabulated blackbox;
both would change when results arrive, not how the scheduler decides. Driving the schedulers
directly keeps the clock simulated and identical to the Optuna references' and Augur's
(compute = epochs trained, wall = simulated epoch-times). Ray's random search samples its
domains directly rather than through BasicVariantGenerator (which needs a running controller
to hand out trials on demand). Syne Tune is 0.13.0: 0.14 and later (0.16.0 is the newest on
PyPI here) no longer ship MOBSTER or the "gpsearchers" extra, and 0.13.0 needs NumPy < 2, so
it has its own venv (Ray 2.60.0's pyarrow needs NumPy ≥ 2).

Prints one JSON line per study, as the Optuna references do: {"problem", "method", "seed",
"workers", "trials", "compute", "wall", "attempts": [attempts ended at epoch 1–2, 3–8, 9–26,
27], "curve": [[compute, wall, best 27-epoch loss], ...]}; give the file to the Rust bench's
`--references`.

Usage: python multi_fidelity_more_references.py --oracle target/release/examples/multi_fidelity
       --methods ray_random_asha | syne_asha,syne_mobster,...
       [--problems curves_hartmann3,mlp_two_moons] [--seeds 10] [--first-seed 0]
"""
import argparse
import contextlib
import json
import logging
import sys
import time

from mf_oracle import MAX_EPOCHS, RUNGS, WORKERS, Oracle  # noqa: E402 (beside this script)


def parameters_of(problem, config):
    """The oracle's assignment from a library's configuration (integers as JSON integers)."""
    if problem == "curves_hartmann3":
        return {f"x{i}": float(config[f"x{i}"]) for i in range(3)}
    return {
        "learning_rate": float(config["learning_rate"]),
        "l2": float(config["l2"]),
        "hidden": int(config["hidden"]),
    }


class RayAsha:
    """Ray Tune's ASHAScheduler with random search."""

    def __init__(self, problem, seed):
        import numpy as np
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler, TrialScheduler

        self.TrialScheduler = TrialScheduler
        if problem == "curves_hartmann3":
            self.space = {f"x{i}": tune.uniform(0.0, 1.0) for i in range(3)}
        else:
            self.space = {
                "learning_rate": tune.loguniform(1e-3, 1.0),
                "l2": tune.loguniform(1e-6, 1e-1),
                "hidden": tune.lograndint(2, 65),  # upper bound exclusive: 2–64
            }
        # on_trial_add draws a bracket with np.random (one bracket here: no draw matters).
        np.random.seed(seed)
        self.rng = np.random.RandomState(seed)
        self.scheduler = ASHAScheduler(time_attr="training_iteration", metric="loss", mode="min",
                                       max_t=MAX_EPOCHS, grace_period=1, reduction_factor=3,
                                       brackets=1)
        self.trials = {}
        self.count = 0

    def next_trial(self):
        """(trial id, configuration, epochs already trained), a new trial each time."""

        class Trial:  # what the scheduler reads of a trial: its id
            def __init__(self, trial_id):
                self.trial_id = trial_id

        self.count += 1
        trial = Trial(f"t{self.count}")
        config = {k: d.sample(random_state=self.rng) for k, d in self.space.items()}
        self.scheduler.on_trial_add(None, trial)
        self.trials[trial.trial_id] = trial
        return trial.trial_id, config, 0

    def report(self, trial_id, epoch, loss):
        """The scheduler's decision: "continue", "stop" (ends the trial) or "pause"."""
        trial = self.trials[trial_id]
        result = {"training_iteration": epoch, "loss": loss}
        decision = self.scheduler.on_trial_result(None, trial, result)
        if decision == self.TrialScheduler.STOP:
            self.scheduler.on_trial_complete(None, trial, result)
            return "stop"
        return "continue"

    def version(self):
        import ray
        return {"ray": ray.__version__}


class SyneHyperband:
    """Syne Tune's ASHA or MOBSTER (HyperbandScheduler), type "stopping" or "promotion"."""

    def __init__(self, problem, seed, searcher, kind):
        from datetime import datetime

        # Syne Tune prints notes on its optional dependencies to stdout: keep stdout JSON.
        with contextlib.redirect_stdout(sys.stderr):
            from syne_tune.backend.trial_status import Trial
            from syne_tune.config_space import lograndint, loguniform, uniform
            from syne_tune.optimizer.baselines import ASHA, MOBSTER
            from syne_tune.optimizer.scheduler import SchedulerDecision

        self.Trial, self.now, self.Decision = Trial, datetime.now, SchedulerDecision
        if problem == "curves_hartmann3":
            space = {f"x{i}": uniform(0.0, 1.0) for i in range(3)}
        else:
            space = {
                "learning_rate": loguniform(1e-3, 1.0),
                "l2": loguniform(1e-6, 1e-1),
                "hidden": lograndint(2, 64),  # both bounds inclusive
            }
        space["epochs"] = MAX_EPOCHS
        common = dict(metric="loss", mode="min", resource_attr="epoch", max_resource_attr="epochs",
                      grace_period=1, reduction_factor=3, brackets=1, type=kind,
                      random_seed=seed)
        cls = ASHA if searcher == "random" else MOBSTER
        self.scheduler = cls(space, **common)
        self.trials = {}
        self.epochs = {}
        self.count = 0

    def next_trial(self):
        """(trial id, configuration, epochs already trained): new, or a paused one resumed."""
        suggestion = self.scheduler.suggest(trial_id=self.count)
        if suggestion is None:
            return None
        if suggestion.spawn_new_trial_id:
            trial = self.Trial(trial_id=self.count, config=suggestion.config.copy(),
                               creation_time=self.now())
            self.count += 1
            self.trials[trial.trial_id] = trial
            self.epochs[trial.trial_id] = 0
            self.scheduler.on_trial_add(trial=trial)
        else:
            trial = self.trials[suggestion.checkpoint_trial_id]
            if suggestion.config is not None:
                trial.config = suggestion.config
        return trial.trial_id, trial.config, self.epochs[trial.trial_id]

    def report(self, trial_id, epoch, loss):
        trial = self.trials[trial_id]
        self.epochs[trial_id] = epoch
        result = {"epoch": epoch, "loss": loss}
        decision = self.scheduler.on_trial_result(trial=trial, result=result)
        if decision == self.Decision.STOP:
            self.scheduler.on_trial_remove(trial=trial)
            return "stop"
        if decision == self.Decision.PAUSE:
            self.scheduler.on_trial_remove(trial=trial)
            return "pause"
        # The training script ends at config["epochs"] (27, or the rung a promoted trial
        # resumes to): the Tuner then reports the trial completed.
        if epoch >= trial.config.get("epochs", MAX_EPOCHS):
            self.scheduler.on_trial_complete(trial, result)
            return "pause" if epoch < MAX_EPOCHS else "stop"
        return "continue"

    def version(self):
        import syne_tune
        return {"syne_tune": syne_tune.__version__}


METHODS = {
    "ray_random_asha": lambda problem, seed: RayAsha(problem, seed),
    "syne_asha": lambda problem, seed: SyneHyperband(problem, seed, "random", "stopping"),
    "syne_mobster": lambda problem, seed: SyneHyperband(problem, seed, "bayesopt", "stopping"),
    "syne_asha_promotion": lambda problem, seed: SyneHyperband(problem, seed, "random", "promotion"),
    "syne_mobster_promotion": lambda problem, seed: SyneHyperband(problem, seed, "bayesopt", "promotion"),
}


def run_study(oracle, problem, method, seed, budget):
    tuner = METHODS[method](problem, seed)
    running = [None] * WORKERS  # [library trial id, oracle trial, parameters, epochs done]
    oracle_ids = {}
    clock = trained = trials = 0
    best = float("inf")
    curve = []
    ended_at = {r: 0 for r in RUNGS}
    started = time.perf_counter()
    while True:
        for w in range(WORKERS):
            if running[w] is None and trained < budget:
                job = tuner.next_trial()
                if job is None:
                    break
                trial_id, config, done = job
                if trial_id not in oracle_ids:
                    oracle_ids[trial_id] = oracle.new_trial()
                    trials += 1
                running[w] = [trial_id, oracle_ids[trial_id], parameters_of(problem, config), done]
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
            trial_id, _, _, epoch = running[w]
            decision = tuner.report(trial_id, epoch, loss)
            if epoch >= MAX_EPOCHS:
                best = min(best, loss)
                curve.append([trained, clock, best])
            elif decision == "continue":
                continue
            ended_at[max(r for r in RUNGS if r <= epoch)] += 1
            running[w] = None
    return {
        "problem": problem, "method": method, "seed": seed, "workers": WORKERS,
        "trials": trials, "compute": trained, "wall": clock,
        "attempts": [ended_at[r] for r in RUNGS], "curve": curve,
        "seconds": round(time.perf_counter() - started, 1), **tuner.version(),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--oracle", required=True, help="the Rust bench's binary")
    p.add_argument("--methods", required=True, help=",".join(METHODS))
    p.add_argument("--problems", default="curves_hartmann3,mlp_two_moons")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=30 * MAX_EPOCHS)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for name in ("syne_tune", "ray"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for problem in a.problems.split(","):
        oracle = Oracle(a.oracle, problem)
        for method in a.methods.split(","):
            if method not in METHODS:
                raise SystemExit(f"unknown method {method}")
            for seed in range(a.first_seed, a.first_seed + a.seeds):
                print(json.dumps(run_study(oracle, problem, method, seed, a.budget)), flush=True)
        oracle.close()


if __name__ == "__main__":
    sys.exit(main())
