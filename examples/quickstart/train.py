#!/usr/bin/env python3
"""A small training script for Augur's quickstart, standard library only.

Trains logistic regression with SGD on a generated two-moons-like data set and reports
validation accuracy. It reads its hyperparameters as command-line flags (as Augur passes
them: --learning_rate=0.01), prints `epoch=N accuracy=X` lines that Augur collects from
stdout, checkpoints every epoch to $AIP_CHECKPOINT_DIR (and resumes from there after a
crash), and saves the final model to $AIP_MODEL_DIR.
"""
import argparse
import json
import math
import os
import random


def make_data(n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.random() < 0.5
        t = rng.uniform(0, math.pi)
        x = math.cos(t) + (1.0 if label else 0.0) + rng.gauss(0, 0.25)
        y = math.sin(t) * (-1 if label else 1) + (0.5 if label else 0.0) + rng.gauss(0, 0.25)
        rows.append(((x, y), 1 if label else 0))
    return rows


def features(point, kind):
    x, y = point
    if kind == "linear":
        return [1.0, x, y]
    if kind == "quadratic":
        return [1.0, x, y, x * x, y * y, x * y]
    # cubic
    return [1.0, x, y, x * x, y * y, x * y, x ** 3, y ** 3, x * x * y, x * y * y]


def sigmoid(z):
    return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


def accuracy(w, rows, kind):
    hits = 0
    for p, label in rows:
        f = features(p, kind)
        hits += (sigmoid(sum(a * b for a, b in zip(w, f))) > 0.5) == bool(label)
    return hits / len(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--learning_rate", type=float, required=True)
    ap.add_argument("--l2", type=float, required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--features", choices=["linear", "quadratic", "cubic"], required=True)
    args = ap.parse_args()

    train, valid = make_data(400, 1), make_data(200, 2)
    dim = len(features((0.0, 0.0), args.features))
    ckpt_dir = os.environ.get("AIP_CHECKPOINT_DIR", "/tmp/quickstart-ckpt")
    os.makedirs(ckpt_dir, exist_ok=True)
    ckpt = os.path.join(ckpt_dir, "checkpoint.json")
    w, start = [0.0] * dim, 0
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            saved = json.load(f)
        w, start = saved["weights"], saved["epoch"]
        print(f"resumed from checkpoint at epoch {start}", flush=True)

    rng = random.Random(3)
    for epoch in range(start + 1, args.epochs + 1):
        rng.shuffle(train)
        for p, label in train:
            f = features(p, args.features)
            g = sigmoid(sum(a * b for a, b in zip(w, f))) - label
            w = [wi - args.learning_rate * (g * fi + args.l2 * wi) for wi, fi in zip(w, f)]
        acc = accuracy(w, valid, args.features)
        print(f"epoch={epoch} accuracy={acc:.4f}", flush=True)
        with open(ckpt + ".tmp", "w") as f:
            json.dump({"weights": w, "epoch": epoch}, f)
        os.replace(ckpt + ".tmp", ckpt)

    if start >= args.epochs:
        # Relaunched with its checkpoint already at the budget (the attempt that got there
        # ended before its result was heard): nothing to train; report the result again.
        print(f"epoch={start} accuracy={accuracy(w, valid, args.features):.4f}", flush=True)

    model_dir = os.environ.get("AIP_MODEL_DIR", "/tmp/quickstart-model")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "model.json"), "w") as f:
        json.dump({"weights": w, "features": args.features}, f)


if __name__ == "__main__":
    main()
