#!/usr/bin/env bash
# Optuna's own GrpcStorageProxy (optuna and grpcio pinned in
# clients/optuna-compat/requirements.txt) against a live `augur serve --optuna-grpc-listen`
# on free loopback ports: on a fresh SQLite file, then on a fresh PostgreSQL database when
# AUGUR_TEST_POSTGRES_URL (an admin URL, as scripts/start-postgres.sh prints) is set; the
# database is dropped afterwards. Makes or reuses a venv in target/optuna-venv. The same
# shape as scripts/vizier-sdk-test.sh.
#   AUGUR_BIN=path     the server binary (default target/debug/augur, built when missing)
# Arguments are passed to pytest: scripts/optuna-grpc-test.sh -k seeded -x
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-target/optuna-venv}
BIN=${AUGUR_BIN:-${CARGO_TARGET_DIR:-target}/debug/augur}
if [ ! -x "$BIN" ]; then
  [ -n "${AUGUR_BIN:-}" ] && { echo "AUGUR_BIN=$BIN is not an executable" >&2; exit 1; }
  cargo build --bin augur
fi
export AUGUR_BIN=$(realpath "$BIN")

# (Re)install only when the venv is new or the pinned versions changed.
stamp="$VENV/.optuna-grpc-installed"
want=$(sha256sum clients/optuna-compat/requirements.txt | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -r clients/optuna-compat/requirements.txt
  echo "$want" > "$stamp"
fi

run_pytest() {
  # GrpcStorageProxy is marked experimental: its warning on every proxy is noise here.
  "$VENV/bin/python" -m pytest clients/optuna-compat -q -p no:cacheprovider \
    -W ignore::optuna.exceptions.ExperimentalWarning "$@"
}

echo "==> Optuna's gRPC storage on SQLite"
AUGUR_TEST_DATABASE_URL="" run_pytest "$@"

if [ -n "${AUGUR_TEST_POSTGRES_URL:-}" ]; then
  db="augur_test_optuna_$$"
  admin="$AUGUR_TEST_POSTGRES_URL"
  psql "$admin" -qc "CREATE DATABASE $db" >/dev/null
  trap 'psql "$admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
  echo "==> Optuna's gRPC storage on PostgreSQL ($db)"
  AUGUR_TEST_DATABASE_URL="${admin%/*}/$db" run_pytest "$@"
fi
