"""Worker pools (issue 31): how soon a freed slot starts the next trial, and what a warm
pool saves against a fresh process per trial. Run through benches/pools.sh.

Every trial is a bash script that appends `start|end STUDY TRIAL PID EPOCHREALTIME` to one
events file (bash's own clock: no `date` process per trial) and prints `loss=…`.

Rows:
- pool: 3 `augur worker --pool` processes x 4 slots, 10 studies (parallel_trials 2 each,
  so demand always exceeds the 12 slots) sharing the pool. A slot is a trial's `client_id`
  (`<worker>/<slot>`); its latency is the time from one trial's script exiting to the start
  of the next trial's script in the same slot: the worker collects the metric, completes the
  trial, leases the next (long poll, fair pick, suggest, token), prepares its directories
  and spawns it.
- local dispatcher: the server's own runner, one study (`executor: local`,
  parallel_trials 1): exit of a trial to the start of the next.
- fresh worker per trial: a new `augur worker --pool` process for each trial (one study,
  parallel_trials 1), from the process's spawn to its trial's start: the start-up that a
  job-per-trial setup pays each time (process, joining the pool, first lease, study read).
"""

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

AUGUR = sys.argv[1]
TRIAL_SECS = float(os.environ.get("AUGUR_BENCH_TRIAL_SECS", "0.3"))
TRIALS_PER_STUDY = int(os.environ.get("AUGUR_BENCH_TRIALS_PER_STUDY", "24"))
FRESH = int(os.environ.get("AUGUR_BENCH_FRESH", "10"))
DATABASE = os.environ.get("AUGUR_BENCH_DATABASE")  # default: a fresh SQLite file

TRAINER = """#!/bin/bash
echo "start $AUGUR_STUDY_ID $AUGUR_TRIAL_ID $$ $EPOCHREALTIME" >> "$POOL_EVENTS"
sleep %s
echo "loss=${1#--x=}"
echo "end $AUGUR_STUDY_ID $AUGUR_TRIAL_ID $$ $EPOCHREALTIME" >> "$POOL_EVENTS"
""" % TRIAL_SECS


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, work):
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        db = DATABASE or "sqlite://%s/augur.db" % work
        self.log = open(os.path.join(work, "server.log"), "w")
        self.proc = subprocess.Popen(
            [AUGUR, "serve", "--listen", "127.0.0.1:%d" % self.port, "--database-url", db],
            stdout=self.log, stderr=self.log, cwd=work,
            env={k: v for k, v in os.environ.items() if k != "AUGUR_TOKEN"})
        for _ in range(200):
            try:
                self.call("GET", "/readyz")
                return
            except Exception:
                time.sleep(0.05)
        raise SystemExit("augur serve did not start: see %s/server.log" % work)

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read()
            return json.loads(text) if text else None

    def trials(self, study):
        return self.call("GET", "/v1/studies/%d/trials?page_size=1000" % study)["trials"]

    def wait_completed(self, studies, limit=600):
        end = time.time() + limit
        for s in studies:
            while self.call("GET", "/v1/studies/%d" % s)["state"] != "completed":
                if time.time() > end:
                    raise SystemExit("study %d did not complete" % s)
                time.sleep(0.2)

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def spec(name, job, max_trials, parallel):
    return {"name": name, "algorithm": "random",
            "metrics": [{"id": "loss", "goal": "minimize"}],
            "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
            "max_trials": max_trials, "parallel_trials": parallel, "trial_job": job}


def worker(server, work, pool, name, slots):
    return subprocess.Popen(
        [AUGUR, "worker", "--url", server.base, "--pool", pool, "--slots", str(slots),
         "--client-id", name, "--job-commands", "bash", "--output-dir", work + "/runs",
         "--env", "POOL_EVENTS=%s/events.log" % work],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "worker-%s.log" % name), "w"),
        cwd=work, env={k: v for k, v in os.environ.items() if k != "AUGUR_TOKEN"})


def read_events(work):
    runs = {}
    path = os.path.join(work, "events.log")
    if not os.path.exists(path):
        return []
    for line in open(path):
        kind, study, trial, pid, at = line.split()
        key = int(pid)
        if kind == "start":
            runs[key] = {"study": int(study), "trial": int(trial), "start": float(at), "end": None}
        else:
            runs[key]["end"] = float(at)
    return list(runs.values())


def quantiles(values):
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]
    return statistics.median(values) * 1000, p90 * 1000, len(values)


def pool_row(work):
    server = Server(work)
    trainer = os.path.join(work, "trainer.sh")
    job = {"executor": "pool", "pool": "bench", "command": ["bash", trainer]}
    studies = [server.call("POST", "/v1/studies", spec("pool-%d" % i, job, TRIALS_PER_STUDY, 2))["id"]
               for i in range(10)]
    workers = [worker(server, work, "bench", name, 4) for name in ("a", "b", "c")]
    started = time.time()
    server.wait_completed(studies)
    wall = time.time() - started
    runs = {(r["study"], r["trial"]): r for r in read_events(work) if r["end"]}
    by_slot = {}
    for s in studies:
        for t in server.trials(s):
            run = runs.get((s, t["id"]))
            if run:
                by_slot.setdefault(t["client_id"], []).append(run)
    gaps = []
    for slot_runs in by_slot.values():
        slot_runs.sort(key=lambda r: r["start"])
        gaps += [b["start"] - a["end"] for a, b in zip(slot_runs, slot_runs[1:])]
    pool = server.call("GET", "/v1/pools/bench")
    for w in workers:
        w.send_signal(signal.SIGINT)
    for w in workers:
        w.wait(timeout=30)
    server.stop()
    return quantiles(gaps), wall, len(runs), pool


def local_row(work):
    server = Server(work)
    trainer = os.path.join(work, "trainer.sh")
    job = {"executor": "local", "command": ["bash", trainer],
           "env": {"POOL_EVENTS": os.path.join(work, "events.log")}}
    study = server.call("POST", "/v1/studies", spec("local", job, TRIALS_PER_STUDY, 1))["id"]
    server.wait_completed([study])
    runs = sorted((r for r in read_events(work) if r["end"]), key=lambda r: r["start"])
    gaps = [b["start"] - a["end"] for a, b in zip(runs, runs[1:])]
    server.stop()
    return quantiles(gaps)


def fresh_row(work):
    server = Server(work)
    trainer = os.path.join(work, "trainer.sh")
    job = {"executor": "pool", "pool": "fresh", "command": ["bash", trainer]}
    study = server.call("POST", "/v1/studies", spec("fresh", job, FRESH, 1))["id"]
    waits = []
    for i in range(FRESH):
        before = len([r for r in read_events(work)])
        spawned = time.time()
        # One id for all: a process stopped just after it took its next trial leaves that
        # trial held, and the next process (the same worker, started afresh) resumes it.
        w = worker(server, work, "fresh", "fresh", 1)
        while True:
            runs = read_events(work)
            if len(runs) > before:
                break
            time.sleep(0.005)
        waits.append(max(r["start"] for r in runs) - spawned)
        # Its trial completes, then the process goes: the next trial needs a new one.
        while server.call("GET", "/v1/studies/%d" % study)["trial_counts"]["completed"] < i + 1:
            time.sleep(0.02)
        w.send_signal(signal.SIGINT)
        w.wait(timeout=30)
    server.stop()
    return quantiles(waits)


def main():
    rows = {}
    for name, fn in (("pool", pool_row), ("local", local_row), ("fresh", fresh_row)):
        work = tempfile.mkdtemp(prefix="augur-pools-bench-")
        with open(os.path.join(work, "trainer.sh"), "w") as f:
            f.write(TRAINER)
        rows[name] = fn(work)
    (p_med, p_p90, p_n), wall, trials, pool = rows["pool"]
    l_med, l_p90, l_n = rows["local"]
    f_med, f_p90, f_n = rows["fresh"]
    print("augur: %s; trials of %.1f s; database: %s" % (AUGUR, TRIAL_SECS, DATABASE or "SQLite"))
    print()
    print("| measure | median | p90 | n |")
    print("|---|---|---|---|")
    print("| pool: slot freed -> next trial started (3 workers x 4 slots, 10 studies) | %.1f ms | %.1f ms | %d |" % (p_med, p_p90, p_n))
    print("| server's local dispatcher: trial exit -> next trial started (1 study, parallel 1) | %.1f ms | %.1f ms | %d |" % (l_med, l_p90, l_n))
    print("| fresh `augur worker --pool` per trial: spawn -> trial started | %.1f ms | %.1f ms | %d |" % (f_med, f_p90, f_n))
    print("| start-up saved per trial by a warm pool slot (fresh - pool) | %.1f ms | %.1f ms | |" % (f_med - p_med, f_p90 - p_p90))
    print()
    s = pool
    print("pool run: %d trials in %.1f s; utilisation %.0f %% (busy %.1f slot-s, idle %.1f slot-s)"
          % (trials, wall, 100 * s["utilisation"], s["busy_slot_secs"], s["idle_slot_secs"]))


main()
