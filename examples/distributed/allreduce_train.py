#!/usr/bin/env python3
"""Data-parallel training with PyTorch's cluster convention, on the standard library alone.

Every replica of a trial runs this same script with the same arguments. It reads only what
Augur (like `torchrun` or Vertex AI) sets: MASTER_ADDR/MASTER_PORT (the primary's address),
WORLD_SIZE and RANK. The replicas rendezvous at the primary over TCP; each computes the
gradient of a least-squares loss on its own shard of generated data, and the primary
all-reduces (sums) the gradients and sends the mean back, so every replica takes the same
step: `torch.distributed`'s all_reduce with gloo, by hand. The primary reports the loss
(`loss=…` on stdout, and through `cloudml-hypertune` when installed), checkpoints to
AIP_CHECKPOINT_DIR every epoch and resumes from it after a crash; every replica then resumes
from the step the primary sends it.

Why not torch itself: the PyPI wheel brings ~3 GB of CUDA libraries, too much for a test
suite that must install what it runs; the TensorFlow example (tf_train.py) shows a real
framework. This one shows that the convention works, with nothing to install.
"""
import argparse
import json
import os
import random
import socket
import struct
import sys
import time

FEATURES = 8


def send(sock, obj):
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def recv(sock):
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            raise ConnectionError("peer closed")
        head += chunk
    (size,) = struct.unpack("!I", head)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return json.loads(data)


def shard(rank, world, n=2000):
    """This replica's rows of a fixed regression problem y = x·w* + noise."""
    rng = random.Random(7)
    w_true = [rng.uniform(-2, 2) for _ in range(FEATURES)]
    rows = []
    for i in range(n):
        x = [rng.gauss(0, 1) for _ in range(FEATURES)]
        y = sum(a * b for a, b in zip(x, w_true)) + rng.gauss(0, 0.1)
        if i % world == rank:
            rows.append((x, y))
    return rows


def gradient(rows, w):
    g = [0.0] * FEATURES
    loss = 0.0
    for x, y in rows:
        err = sum(a * b for a, b in zip(x, w)) - y
        loss += err * err
        for j in range(FEATURES):
            g[j] += 2 * err * x[j]
    return g, loss, len(rows)


def rendezvous(rank, world, addr, port):
    """The primary listens and accepts world-1 peers; the others connect (retrying)."""
    if rank == 0:
        server = socket.create_server((addr, port), reuse_port=False)
        peers = []
        while len(peers) < world - 1:
            conn, _ = server.accept()
            peer_rank = recv(conn)["rank"]
            peers.append((peer_rank, conn))
        return sorted(peers)
    deadline = time.time() + 60
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=60)
            send(sock, {"rank": rank})
            return sock
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--learning_rate", type=float, required=True)
    p.add_argument("--epochs", type=int, default=20)
    args = p.parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    addr, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0"))
    print(f"replica {os.environ.get('AUGUR_REPLICA')} rank {rank} of {world}, primary at {addr}:{port}", flush=True)
    rows = shard(rank, world)

    ckpt = os.path.join(os.environ["AIP_CHECKPOINT_DIR"], "allreduce.json")
    state = {"epoch": 0, "w": [0.0] * FEATURES}
    if rank == 0 and os.path.exists(ckpt):
        with open(ckpt) as f:
            state = json.load(f)
        print(f"resuming from epoch {state['epoch']}", flush=True)
    hpt = None
    if rank == 0:
        try:
            import hypertune
            hpt = hypertune.HyperTune()
        except ImportError:
            pass

    link = rendezvous(rank, world, addr, port) if world > 1 else []
    if rank == 0:
        for _, conn in link:
            send(conn, state)
    else:
        state = recv(link)
    print(f"rendezvous done: {world} replicas, starting at epoch {state['epoch'] + 1}", flush=True)

    w = state["w"]
    for epoch in range(state["epoch"] + 1, args.epochs + 1):
        g, loss, n = gradient(rows, w)
        if rank == 0:
            for _, conn in link:
                peer = recv(conn)
                g = [a + b for a, b in zip(g, peer["g"])]
                loss += peer["loss"]
                n += peer["n"]
            step = [-args.learning_rate * gj / n for gj in g]
            for _, conn in link:
                send(conn, {"step": step})
        else:
            send(link, {"g": g, "loss": loss, "n": n})
            step = recv(link)["step"]
        w = [a + b for a, b in zip(w, step)]
        if rank == 0:
            mse = loss / n
            print(f"epoch={epoch} loss={mse:.6g} all_reduce_world={world}", flush=True)
            if hpt:
                hpt.report_hyperparameter_tuning_metric(
                    hyperparameter_metric_tag="loss", metric_value=mse, global_step=epoch)
            with open(ckpt + ".tmp", "w") as f:
                json.dump({"epoch": epoch, "w": w}, f)
            os.replace(ckpt + ".tmp", ckpt)
    if rank == 0:
        os.makedirs(os.environ["AIP_MODEL_DIR"], exist_ok=True)
        with open(os.path.join(os.environ["AIP_MODEL_DIR"], "model.json"), "w") as f:
            json.dump({"w": w}, f)


if __name__ == "__main__":
    sys.exit(main())
