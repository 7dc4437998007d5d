#!/usr/bin/env bash
# Browser tests of the dashboard: Debian's headless Chromium, driven by playwright-core from
# npm (kept under tests/browser/), against a live `augur serve` on a seeded SQLite database:
# a 60-trial study, a two-metric study, a 50,000-trial study and a study named and labelled
# with spreadsheet formulas and HTML; then the same on PostgreSQL when AUGUR_TEST_POSTGRES_URL
# is set (scripts/test.sh sets it); and the trial page's terminal, typed into, on a server that
# requires tokens. Installs Chromium and playwright-core when missing.
# Screenshots: target/browser-artifacts/{sqlite,postgres}/.
set -euo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-target}"
artifacts="$PWD/target/browser-artifacts"
large="${AUGUR_BROWSER_LARGE:-50000}"

if ! command -v chromium >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if [ ! -d tests/browser/node_modules/playwright-core ]; then
  (cd tests/browser && npm ci --no-audit --no-fund --silent)
fi

# The timings printed are for the binary people run (release); AUGUR_BROWSER_PROFILE=debug
# skips that build for a quicker check. AUGUR_BROWSER_LIMIT_MS=1000 makes the 1 s target fail
# the run (by default only a 10 s sanity bound does: timings depend on the machine's load).
profile="${AUGUR_BROWSER_PROFILE:-release}"
if [ "$profile" = release ]; then
  cargo build --quiet --release --bin augur
else
  cargo build --quiet --bin augur
fi
limit_ms="${AUGUR_BROWSER_LIMIT_MS:-10000}"

work=$(mktemp -d)
server_pid=""
pg_db=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  if [ -n "$pg_db" ]; then psql -q "$AUGUR_TEST_POSTGRES_URL" -c "DROP DATABASE IF EXISTS $pg_db" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# Seeds a database, serves it and runs the browser checks against it.
run_on() {
  local label=$1 db=$2
  echo "== $label: seeding ($large trials in the large study)"
  if ! AUGUR_BROWSER_DB="$db" AUGUR_BROWSER_LARGE="$large" AUGUR_BROWSER_RUNS="$work/runs-$label" \
    cargo test --quiet --test api dashboard::seed_browser_fixture -- --ignored --exact --nocapture >"$work/seed.log" 2>&1; then
    cat "$work/seed.log"
    exit 1
  fi
  grep seeded "$work/seed.log"

  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  AUGUR_LOG=warn "$target/$profile/augur" serve --database-url "$db" --listen "127.0.0.1:$port" &
  server_pid=$!
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done

  mkdir -p "$artifacts/$label"
  echo "== $label: serving with the $profile build; time limit $limit_ms ms"
  ARTIFACTS="$artifacts/$label" AUGUR_BROWSER_LIMIT_MS="$limit_ms" node tests/browser/dashboard.mjs "http://127.0.0.1:$port" 1 2 3 4 5 6 7 8
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""
}

# The probe's drive-by: a page of another site (and a rebound DNS name) tries to make an open
# server run a command (tests/browser/driveby.mjs).
driveby() {
  local port bin
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  bin=$(realpath "$target/$profile/augur")
  # run from the scratch directory: the study's output would land in the current one
  (cd "$work" && AUGUR_LOG=warn exec "$bin" serve --database-url "sqlite://$work/driveby.db" --listen "127.0.0.1:$port") &
  server_pid=$!
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  echo "== drive-by against an open server"
  node tests/browser/driveby.mjs "http://127.0.0.1:$port" "$work/pwned"
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""
}
driveby

# The trial page's terminal (tests/browser/terminal.mjs) on a server that requires tokens.
terminal() {
  local port bin admin
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  bin=$(realpath "$target/$profile/augur")
  admin="terminal-admin-$(python3 -c 'import secrets; print(secrets.token_hex(12))')"
  mkdir -p "$work/terminal-runs"
  (cd "$work" && AUGUR_LOG=warn AUGUR_TOKEN="$admin" exec "$bin" serve --database-url "sqlite://$work/terminal.db" --listen "127.0.0.1:$port") &
  server_pid=$!
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  mkdir -p "$artifacts/terminal"
  echo "== terminal: a shell in a running trial from its page"
  ARTIFACTS="$artifacts/terminal" node tests/browser/terminal.mjs "http://127.0.0.1:$port" "$admin" "$work/terminal-runs"
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""
}
terminal

run_on sqlite "sqlite://$work/augur.db"
# PostgreSQL too when scripts/test.sh has started it (AUGUR_BROWSER_BACKENDS=sqlite skips it).
if [ -n "${AUGUR_TEST_POSTGRES_URL:-}" ] && [ "${AUGUR_BROWSER_BACKENDS:-sqlite postgres}" != sqlite ]; then
  pg_db="augur_browser_$$"
  PGOPTIONS="-c client_min_messages=warning" psql -q "$AUGUR_TEST_POSTGRES_URL" -c "DROP DATABASE IF EXISTS $pg_db" -c "CREATE DATABASE $pg_db" >/dev/null
  run_on postgres "${AUGUR_TEST_POSTGRES_URL%/*}/$pg_db"
fi
