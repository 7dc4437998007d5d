"""Trials per second of a TPE study run by N processes through Optuna's GrpcStorageProxy:
on `augur serve --optuna-grpc-listen` versus Optuna's own `run_grpc_proxy_server` over
RDBStorage, both on the same PostgreSQL (a database each). Medians over --runs runs, each
a fresh study; the clock runs from the moment every worker is connected and waiting to the
moment the last one is done (process start and imports are not counted). Run by run.sh."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
import warnings
from typing import List

# GrpcStorageProxy is marked experimental: its warning on every proxy is noise here.
warnings.filterwarnings("ignore", message=".*GrpcStorageProxy is experimental.*")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def objective(trial) -> float:  # type: ignore[no-untyped-def]
    x = trial.suggest_float("x", -10, 10)
    y = trial.suggest_float("y", 1e-4, 1.0, log=True)
    z = trial.suggest_int("z", 0, 10)
    return (x - 2) ** 2 + (y - 0.1) ** 2 + (z - 3) ** 2


def worker(port: int, name: str, n_trials: int, seed: int, ready, go) -> None:  # type: ignore[no-untyped-def]
    import optuna
    from optuna.storages import GrpcStorageProxy

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = GrpcStorageProxy(host="127.0.0.1", port=port)
    study = optuna.load_study(study_name=name, storage=storage,
                              sampler=optuna.samplers.TPESampler(seed=seed))
    ready.release()
    go.wait()
    study.optimize(objective, n_trials=n_trials)


def one_run(port: int, processes: int, trials: int) -> float:
    import optuna
    from optuna.storages import GrpcStorageProxy

    name = f"bench-{uuid.uuid4().hex[:8]}"
    optuna.create_study(study_name=name, storage=GrpcStorageProxy(host="127.0.0.1", port=port))
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    per = trials // processes
    procs = [ctx.Process(target=worker, args=(port, name, per, i, ready, go))
             for i in range(processes)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    start = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a worker failed ({p.exitcode})")
    elapsed = time.perf_counter() - start
    done = len(optuna.load_study(study_name=name,
                                 storage=GrpcStorageProxy(host="127.0.0.1", port=port)).trials)
    assert done == per * processes, (done, per * processes)
    return done / elapsed


def wait_port(port: int, proc: subprocess.Popen, what: str) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up")


def augur_server(binary: str, database_url: str, log: str):  # type: ignore[no-untyped-def]
    http, grpc_port = free_port(), free_port()
    proc = subprocess.Popen([binary, "serve", "--database-url", database_url,
                             "--listen", f"127.0.0.1:{http}",
                             "--optuna-grpc-listen", f"127.0.0.1:{grpc_port}"],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            env=dict(os.environ, AUGUR_LOG="warn"))
    wait_port(grpc_port, proc, "augur serve")
    return proc, grpc_port


def optuna_server(database_url: str, log: str):  # type: ignore[no-untyped-def]
    port = free_port()
    code = ("import optuna; from optuna.storages import run_grpc_proxy_server, get_storage;"
            "optuna.logging.set_verbosity(optuna.logging.WARNING);"
            f"run_grpc_proxy_server(get_storage({database_url!r}), host='127.0.0.1', port={port})")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)
    wait_port(port, proc, "run_grpc_proxy_server")
    return proc, port


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--augur-bin", required=True)
    parser.add_argument("--augur-db", required=True, help="postgres://… for Augur")
    parser.add_argument("--optuna-db", required=True, help="postgresql+psycopg2://… for RDBStorage")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--log", default="target/optuna-bench.log")
    args = parser.parse_args()

    rows = []
    for label, start in [
        ("Augur (--optuna-grpc-listen)", lambda: augur_server(args.augur_bin, args.augur_db, args.log)),
        ("Optuna run_grpc_proxy_server + RDBStorage", lambda: optuna_server(args.optuna_db, args.log)),
    ]:
        proc, port = start()
        try:
            rates: List[float] = [one_run(port, args.processes, args.trials) for _ in range(args.runs)]
        finally:
            proc.terminate()
            proc.wait(10)
        rows.append((label, statistics.median(rates), rates))

    print(f"\nTPE, {args.processes} processes x {args.trials // args.processes} trials, "
          f"median of {args.runs} runs, same PostgreSQL")
    print(f"| {'server':<44} | {'trials/s (median)':>17} | runs |")
    print(f"|{'-' * 46}|{'-' * 19}|------|")
    for label, median, rates in rows:
        runs = ", ".join(f"{r:.1f}" for r in rates)
        print(f"| {label:<44} | {median:>17.1f} | {runs} |")


if __name__ == "__main__":
    main()
