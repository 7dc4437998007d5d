#!/usr/bin/env bash
# The Optuna load benchmark (load.py): optuna.load_study + study.trials_dataframe on a study
# of 10,000 trials through GrpcStorageProxy on `augur serve --optuna-grpc-listen` (SQLite;
# and PostgreSQL when $AUGUR_TEST_POSTGRES_URL, an admin URL as scripts/start-postgres.sh
# prints, is set: a fresh database, dropped afterwards), and on Optuna's own RDBStorage on
# SQLite, through its run_grpc_proxy_server and read directly (and on PostgreSQL through its
# server, in a second fresh database, when that URL is set).
#   AUGUR_BIN=path   the server (default: target/release/augur; build it with
#                    `cargo build --release`: timings of a debug build are not Augur's)
# Arguments go to load.py: benches/optuna-storage/run-load.sh --trials 2000 --runs 3
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=$(realpath "${AUGUR_BIN:-${CARGO_TARGET_DIR:-target}/release/augur}")
VENV=$(realpath -m "${VENV:-target/optuna-venv}")
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q -r clients/optuna-compat/requirements.txt -r benches/optuna-storage/requirements.txt

pg=()
if [ -n "${AUGUR_TEST_POSTGRES_URL:-}" ]; then
  admin="$AUGUR_TEST_POSTGRES_URL"
  a="augur_bench_load_$$" o="optuna_bench_load_$$"
  psql "$admin" -qc "CREATE DATABASE $a" >/dev/null
  psql "$admin" -qc "CREATE DATABASE $o" >/dev/null
  trap 'psql "$admin" -qc "DROP DATABASE IF EXISTS $a WITH (FORCE)" >/dev/null 2>&1 || true; psql "$admin" -qc "DROP DATABASE IF EXISTS $o WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
  optuna_url="${admin%/*}/$o"
  pg=(--augur-pg "${admin%/*}/$a" --optuna-pg "postgresql+psycopg2://${optuna_url#*://}")
fi
cd benches/optuna-storage
"$VENV/bin/python" load.py --augur-bin "$BIN" --log ../../target/optuna-load-bench.log "${pg[@]}" "$@"
