"""Aggregate quality-bench JSON lines into markdown tables (stdout).

Per function and parallel setting: median (mean) simple regret over seeds at 10/30/50/100
trials, median ms per suggestion over trials 40-50, and the mean rank of each optimizer
(by median regret at the function's budget) across functions and settings. Then the target
check: gp_bandit's median regret against the best reference's at 30, 50 and 100 trials
(references: every optimizer whose name is not gp_bandit*, random or quasi_random).
"""
import collections
import gzip
import json
import os
import statistics as st
import sys

CHECKPOINTS = (10, 30, 50, 100)
TARGET_CHECKPOINTS = (30, 50, 100)
NOT_REFERENCES = ("gp_bandit", "random", "quasi_random", "py_random")

rows = collections.defaultdict(list)
for path in sys.argv[1:]:
    # The committed runs (data/) are gzipped JSON lines.
    for line in (gzip.open(path, "rt") if path.endswith(".gz") else open(path)):
        if line.strip():
            d = json.loads(line)
            rows[(d["function"], d["parallel"], d["optimizer"])].append(d)

functions = []
for (f, p, _o) in rows:
    if (f, p) not in functions:
        functions.append((f, p))
order = ["branin", "hartmann6", "rosenbrock4", "ackley5", "levy10", "levy10_offcentre",
         "rosenbrock6_offcentre", "mixed_train5", "mixed_ackley6"]
functions.sort(key=lambda k: (order.index(k[0]) if k[0] in order else 99, k[1]))
ranks = collections.defaultdict(list)


def fmt(v):
    return f"{v:.3g}"


for f, p in functions:
    opts = sorted(o for (ff, pp, o) in rows if ff == f and pp == p)
    budget = max(len(r["regret"]) for o in opts for r in rows[(f, p, o)])
    cps = [c for c in CHECKPOINTS if c <= budget]
    print(f"\n## {f}, parallel_trials {p} (budget {budget})\n")
    print("| optimizer | seeds | " + " | ".join(f"@{c}" for c in cps) + " | ms/sugg @50 |")
    print("|---|---|" + "---|" * len(cps) + "---|")
    finals = {}
    for o in opts:
        rs = rows[(f, p, o)]
        cells = []
        for c in cps:
            vals = [r["regret"][min(c, len(r["regret"])) - 1] for r in rs]
            cells.append(f"{fmt(st.median(vals))} ({fmt(st.mean(vals))})")
        finals[o] = st.median([r["regret"][-1] for r in rs])
        ms = st.median([m for r in rs for m in r["ms"][39:50]] or [0.0])
        print(f"| {o} | {len(rs)} | " + " | ".join(cells) + f" | {ms:.1f} |")
    ordered = sorted(finals, key=lambda o: finals[o])
    for o in opts:
        # Ties share the better rank.
        ranks[o].append(1 + sum(1 for q in ordered if finals[q] < finals[o]))

print("\n## Target check: gp_bandit against the best reference\n")
print("Median simple regret; `ratio` = gp_bandit / best reference (≤ 1 meets the target).\n")
print("| function | parallel | trials | gp_bandit | best reference | its median | ratio | met |")
print("|---|---|---|---|---|---|---|---|")
met_count = total = 0
for f, p in functions:
    if (f, p, "gp_bandit") not in rows:
        continue
    budget = len(rows[(f, p, "gp_bandit")][0]["regret"])
    refs = [o for (ff, pp, o) in rows if ff == f and pp == p and not o.startswith(NOT_REFERENCES)]
    for c in TARGET_CHECKPOINTS:
        if c > budget or not refs:
            continue
        med = lambda o: st.median([r["regret"][min(c, len(r["regret"])) - 1] for r in rows[(f, p, o)]])
        g = med("gp_bandit")
        best = min(refs, key=med)
        b = med(best)
        ratio = g / b if b > 0 else (1.0 if g <= 0 else float("inf"))
        met = g <= b
        met_count += met
        total += 1
        print(f"| {f} | {p} | {c} | {fmt(g)} | {best} ({len(rows[(f, p, best)])} seeds) | {fmt(b)} | {ratio:.2f} | {'yes' if met else 'no'} |")
print(f"\nMet in {met_count} of {total} cells.")

print("\n## Mean rank (median regret at budget, over functions and settings)\n")
print("| optimizer | mean rank | cells |")
print("|---|---|---|")
for o, r in sorted(ranks.items(), key=lambda kv: st.mean(kv[1])):
    print(f"| {o} | {st.mean(r):.2f} | {len(r)} |")


# Optional plot of median best-so-far regret against trials (needs matplotlib, which the
# bench's venv installs); written next to the JSON lines when PLOT names a file.
plot = os.environ.get("PLOT")
if plot:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"\n(no matplotlib: {plot} not written)", file=sys.stderr)
    else:
        fig, axes = plt.subplots(2, len(functions) // 2 + len(functions) % 2, figsize=(20, 8), squeeze=False)
        # One colour per optimizer across every panel.
        every = sorted({o for (_f, _p, o) in rows})
        colour = {o: f"C{i % 10}" for i, o in enumerate(every)}
        for ax, (f, p) in zip(axes.T.flat, functions):
            for o in sorted(o for (ff, pp, o) in rows if ff == f and pp == p):
                rs = rows[(f, p, o)]
                n = min(len(r["regret"]) for r in rs)
                med = [st.median([max(r["regret"][t], 1e-9) for r in rs]) for t in range(n)]
                ax.plot(range(1, n + 1), med, label=o, color=colour[o])
            ax.set_yscale("log")
            ax.set_title(f"{f}, parallel {p}")
            ax.set_xlabel("trials")
            ax.set_ylabel("median simple regret")
        handles = [plt.Line2D([], [], color=colour[o], label=o) for o in every]
        axes.flat[0].legend(handles=handles, fontsize=8)
        fig.tight_layout()
        fig.savefig(plot, dpi=80)
