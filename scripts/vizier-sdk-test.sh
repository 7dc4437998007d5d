#!/usr/bin/env bash
# The unchanged Vertex AI SDK (google-cloud-aiplatform, pinned in
# clients/vizier-compat/requirements.txt) against a live `augur serve` on a free loopback
# port: on a fresh SQLite file, then on a fresh PostgreSQL database when
# AUGUR_TEST_POSTGRES_URL (an admin URL, as scripts/start-postgres.sh prints) is set; the
# database is dropped afterwards. Makes or reuses a venv in target/vizier-venv.
#   AUGUR_BIN=path     the server binary (default target/debug/augur, built when missing)
# Arguments are passed to pytest: scripts/vizier-sdk-test.sh -k generated -x
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-target/vizier-venv}
BIN=${AUGUR_BIN:-target/debug/augur}
if [ ! -x "$BIN" ]; then
  [ -n "${AUGUR_BIN:-}" ] && { echo "AUGUR_BIN=$BIN is not an executable" >&2; exit 1; }
  cargo build --bin augur
fi
export AUGUR_BIN=$(realpath "$BIN")

# (Re)install only when the venv is new or the pinned versions changed.
stamp="$VENV/.vizier-sdk-installed"
want=$(sha256sum clients/vizier-compat/requirements.txt | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -r clients/vizier-compat/requirements.txt
  echo "$want" > "$stamp"
fi

run_pytest() {
  "$VENV/bin/python" -m pytest clients/vizier-compat -q -p no:cacheprovider "$@"
}

echo "==> Vertex AI Vizier SDK on SQLite"
AUGUR_TEST_DATABASE_URL="" run_pytest "$@"

if [ -n "${AUGUR_TEST_POSTGRES_URL:-}" ]; then
  db="augur_test_vizier_$$"
  admin="$AUGUR_TEST_POSTGRES_URL"
  psql "$admin" -qc "CREATE DATABASE $db" >/dev/null
  trap 'psql "$admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true' EXIT
  echo "==> Vertex AI Vizier SDK on PostgreSQL ($db)"
  AUGUR_TEST_DATABASE_URL="${admin%/*}/$db" run_pytest "$@"
fi
