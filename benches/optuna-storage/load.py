"""`optuna.load_study(...)` + `study.trials_dataframe()` on a study of N finished trials
(default 10,000): through Optuna's GrpcStorageProxy on `augur serve --optuna-grpc-listen`
(SQLite, and PostgreSQL when --augur-pg names a database), on Optuna's own
`run_grpc_proxy_server` over RDBStorage on SQLite, and on that RDBStorage read directly
(no server: what an Optuna user without a storage server gets). Each storage is filled once
with the same trials (4 parameters of the four kinds, a value, 2 intermediate values, a user
attribute); each run then loads the study with a fresh client (empty cache) in this process.
Prints a table of medians over --runs runs, with the two parts apart. Run by run-load.sh."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Tuple

# GrpcStorageProxy is marked experimental: its warning on every proxy is noise here.
warnings.filterwarnings("ignore", message=".*GrpcStorageProxy is experimental.*")

import optuna  # noqa: E402
import pandas  # noqa: E402,F401  (imported here: its first import would count in one run)
from optuna.distributions import (  # noqa: E402
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.storages import GrpcStorageProxy, RDBStorage  # noqa: E402
from optuna.storages._grpc.auto_generated import api_pb2  # noqa: E402
from optuna.trial import create_trial  # noqa: E402

from bench import augur_server, optuna_server  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)

DISTRIBUTIONS = {
    "x": FloatDistribution(-10, 10),
    "lr": FloatDistribution(1e-5, 1e-1, log=True),
    "n": IntDistribution(1, 8),
    "kind": CategoricalDistribution(["a", "b", "c"]),
}


def trials(n: int) -> List[Any]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        params = {"x": rng.uniform(-10, 10), "lr": 10 ** rng.uniform(-5, -1),
                  "n": rng.randint(1, 8), "kind": rng.choice(["a", "b", "c"])}
        value = (params["x"] - 2) ** 2 + params["n"]
        out.append(create_trial(params=params, distributions=DISTRIBUTIONS, value=value,
                                intermediate_values={0: value * 2, 1: value * 1.5},
                                user_attrs={"i": i}))
    return out


def fill(make_storage: Callable[[], Any], name: str, n: int, threads: int) -> None:
    """The study of `name` with n trials, added by `threads` clients at once."""
    storage = make_storage()
    study_id = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], name)
    todo = trials(n)
    per = (n + threads - 1) // threads

    def add(chunk: List[Any]) -> None:
        mine = make_storage()
        for t in chunk:
            mine.create_new_trial(study_id, template_trial=t)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(add, [todo[i:i + per] for i in range(0, n, per)]))


def one_load(make_storage: Callable[[], Any], name: str, n: int) -> Tuple[float, float]:
    """Seconds of load_study, then of trials_dataframe, with a fresh client."""
    start = time.perf_counter()
    study = optuna.load_study(study_name=name, storage=make_storage())
    loaded = time.perf_counter()
    frame = study.trials_dataframe()
    done = time.perf_counter()
    assert len(frame) == n, (len(frame), n)
    assert frame["params_kind"].notna().all()
    return loaded - start, done - loaded


def one_rpc(make_storage: Callable[[], Any], name: str, n: int) -> float:
    """Seconds of the one GetTrials call a fresh client's cache makes for every trial: the
    server's part (and the transfer), without the client's conversion to FrozenTrial."""
    storage = make_storage()
    study_id = storage.get_study_id_from_name(name)
    start = time.perf_counter()
    reply = storage._stub.GetTrials(api_pb2.GetTrialsRequest(study_id=study_id,
                                                             trial_id_greater_than=-1))
    elapsed = time.perf_counter() - start
    assert len(reply.trials) == n, (len(reply.trials), n)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--augur-bin", required=True)
    parser.add_argument("--augur-pg", help="postgres://… database for Augur (optional)")
    parser.add_argument("--optuna-pg",
                        help="postgresql+psycopg2://… database for Optuna's RDBStorage (optional)")
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fill-threads", type=int, default=8)
    parser.add_argument("--log", default="target/optuna-load-bench.log")
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="optuna-load-")
    rdb_url = f"sqlite:///{os.path.join(tmp, 'optuna-rdb.db')}"
    # One RDBStorage filled once, read directly and through Optuna's own server.
    fill(lambda: RDBStorage(rdb_url), "load", args.trials, 1)

    setups: List[Tuple[str, Callable[[], Tuple[Any, Callable[[], Any]]]]] = []

    def augur(url: str) -> Callable[[], Tuple[Any, Callable[[], Any]]]:
        def start() -> Tuple[Any, Callable[[], Any]]:
            proc, port = augur_server(args.augur_bin, url, args.log)
            return proc, lambda: GrpcStorageProxy(host="127.0.0.1", port=port)
        return start

    setups.append(("Augur, SQLite (GrpcStorageProxy)",
                   augur(f"sqlite://{os.path.join(tmp, 'augur.db')}")))
    if args.augur_pg:
        setups.append(("Augur, PostgreSQL (GrpcStorageProxy)", augur(args.augur_pg)))

    def optuna_grpc() -> Tuple[Any, Callable[[], Any]]:
        proc, port = optuna_server(rdb_url, args.log)
        return proc, lambda: GrpcStorageProxy(host="127.0.0.1", port=port)

    setups.append(("Optuna run_grpc_proxy_server + RDB SQLite", optuna_grpc))
    if args.optuna_pg:
        fill(lambda: RDBStorage(args.optuna_pg), "load", args.trials, 1)

        def optuna_grpc_pg() -> Tuple[Any, Callable[[], Any]]:
            proc, port = optuna_server(args.optuna_pg, args.log)
            return proc, lambda: GrpcStorageProxy(host="127.0.0.1", port=port)

        setups.append(("Optuna run_grpc_proxy_server + RDB PostgreSQL", optuna_grpc_pg))
    setups.append(("Optuna RDBStorage, SQLite (direct)", lambda: (None, lambda: RDBStorage(rdb_url))))

    rows = []
    for label, start in setups:
        proc, make_storage = start()
        try:
            if label.startswith("Augur"):
                t0 = time.perf_counter()
                fill(make_storage, "load", args.trials, args.fill_threads)
                print(f"{label}: filled {args.trials} trials in {time.perf_counter() - t0:.0f} s",
                      flush=True)
            runs = [one_load(make_storage, "load", args.trials) for _ in range(args.runs)]
            rpc = (statistics.median(one_rpc(make_storage, "load", args.trials)
                                     for _ in range(args.runs))
                   if "GrpcStorageProxy" in label or "grpc" in label else None)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(10)
        total = [a + b for a, b in runs]
        rows.append((label, statistics.median(total), statistics.median(a for a, _ in runs),
                     statistics.median(b for _, b in runs), rpc, total))
        print(f"{label}: {', '.join(f'{t:.2f}' for t in total)} s", flush=True)

    print(f"\nload_study + trials_dataframe, {args.trials} trials, fresh client, "
          f"median of {args.runs} runs (seconds)")
    print(f"| {'storage':<42} | total | load_study | trials_dataframe | GetTrials alone | runs |")
    print(f"|{'-' * 44}|-------|------------|------------------|-----------------|------|")
    for label, total, load, frame, rpc, runs in rows:
        rpc_text = f"{rpc:15.2f}" if rpc is not None else f"{'-':>15}"
        print(f"| {label:<42} | {total:5.2f} | {load:10.2f} | {frame:16.2f} | {rpc_text} | "
              f"{', '.join(f'{t:.2f}' for t in runs)} |")


if __name__ == "__main__":
    main()
