#!/usr/bin/env bash
# The Optuna storage benchmark (bench.py): TPE with 8 processes through GrpcStorageProxy,
# on `augur serve --optuna-grpc-listen` and on Optuna's run_grpc_proxy_server over
# RDBStorage, on the same PostgreSQL ($AUGUR_TEST_POSTGRES_URL, an admin URL as
# scripts/start-postgres.sh prints), a fresh database each, dropped afterwards.
#   AUGUR_BIN=path   the server (default: target/release/augur; build it with
#                    `cargo build --release`: timings of a debug build are not Augur's)
# Arguments go to bench.py: benches/optuna-storage/run.sh --trials 400 --runs 5
set -euo pipefail
cd "$(dirname "$0")/../.."

: "${AUGUR_TEST_POSTGRES_URL:?set it, e.g. from scripts/start-postgres.sh}"
BIN=$(realpath "${AUGUR_BIN:-${CARGO_TARGET_DIR:-target}/release/augur}")
VENV=${VENV:-target/optuna-venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q -r clients/optuna-compat/requirements.txt -r benches/optuna-storage/requirements.txt

admin="$AUGUR_TEST_POSTGRES_URL"
a="augur_bench_optuna_$$" o="optuna_bench_rdb_$$"
psql "$admin" -qc "CREATE DATABASE $a" >/dev/null
psql "$admin" -qc "CREATE DATABASE $o" >/dev/null
trap 'for d in $a $o; do psql "$admin" -qc "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1 || true; done' EXIT
base="${admin%/*}"
"$VENV/bin/python" benches/optuna-storage/bench.py --augur-bin "$BIN" \
  --augur-db "$base/$a" --optuna-db "${base/postgres:\/\//postgresql+psycopg2://}/$o" "$@"
