#!/usr/bin/env python3
"""Medians over more seeds than the target table's ten, for chosen cells.

Reads every run in benches/quality/data/*.jsonl.gz and data/diagnostics/*.jsonl.gz (but not
the former defaults' gp_bandit runs, `*opt21*`, nor the same-design runs) with seeds below
--seeds, and prints, per cell FUNCTION:PARALLEL:TRIALS, gp_bandit's median simple regret, each
reference's with its seed count, the reference with the lowest median, the ratio, a 95% bootstrap interval of that ratio (the
seeds of each side resampled with replacement, 10,000 times, fixed seed), and on how many
of the seeds both ran gp_bandit's regret is the lower. An interval that holds 1 means the
seeds cannot tell the two apart:

    python3 benches/quality/more_seeds.py ackley5:1:30 hartmann6:5:100
"""
import argparse
import collections
import glob
import gzip
import json
import os
import random
import statistics

REFERENCES = ["optuna_gp", "botorch_qlognei", "optuna_tpe"]


def load(data, max_seed):
    files = glob.glob(os.path.join(data, "*.jsonl.gz")) + glob.glob(
        os.path.join(data, "diagnostics", "*.jsonl.gz")
    )
    runs = collections.defaultdict(dict)  # (function, parallel, optimizer) -> seed -> regret
    for path in files:
        name = os.path.basename(path)
        if "opt21" in name or "same_design" in name:
            continue
        with gzip.open(path, "rt") as f:
            for line in f:
                r = json.loads(line)
                if r["seed"] < max_seed:
                    runs[(r["function"], r["parallel"], r["optimizer"])][r["seed"]] = r["regret"]
    return runs


def ratio_interval(ours, theirs, draws=10_000, seed=0):
    """The 2.5th and 97.5th percentiles of median(ours*) / median(theirs*) over bootstrap
    resamples of each list; the two sides are independent studies, so they are resampled
    independently."""
    rng = random.Random(seed)
    ratios = sorted(
        statistics.median(rng.choices(ours, k=len(ours)))
        / max(statistics.median(rng.choices(theirs, k=len(theirs))), 1e-300)
        for _ in range(draws)
    )
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cells", nargs="+", help="FUNCTION:PARALLEL:TRIALS")
    ap.add_argument("--seeds", type=int, default=30, help="use seeds 0..N-1")
    ap.add_argument("--data", default=os.path.join(here, "data"))
    a = ap.parse_args()
    runs = load(a.data, a.seeds)
    print("| cell | gp_bandit (seeds) | " + " | ".join(REFERENCES) + " | best | ratio | 95% interval | gp_bandit lower |")
    print("|---|---|" + "---|" * len(REFERENCES) + "---|---|---|---|")
    for cell in a.cells:
        function, parallel, trials = cell.split(":")
        parallel, trials = int(parallel), int(trials)
        ours = runs.get((function, parallel, "gp_bandit"))
        if not ours:
            raise SystemExit(f"{cell}: no gp_bandit runs")
        at = lambda r: statistics.median(v[trials - 1] for v in r.values())
        columns, best = [], None
        for ref in REFERENCES:
            r = runs.get((function, parallel, ref), {})
            if not r:
                columns.append("–")
                continue
            columns.append(f"{at(r):.3g} ({len(r)})")
            if best is None or at(r) < at(best[1]):
                best = (ref, r)
        name, r = best
        both = [s for s in r if s in ours]
        lower = sum(ours[s][trials - 1] < r[s][trials - 1] for s in both)
        low, high = ratio_interval(
            [v[trials - 1] for v in ours.values()], [v[trials - 1] for v in r.values()]
        )
        print(
            f"| {function} p{parallel} @{trials} | {at(ours):.3g} ({len(ours)}) | "
            + " | ".join(columns)
            + f" | {name} | {at(ours) / at(r):.2f} | {low:.3g}–{high:.3g} | {lower} of {len(both)} |"
        )


if __name__ == "__main__":
    main()
