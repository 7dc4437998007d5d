#!/usr/bin/env bash
# The test command: everything CI runs. Starts (or installs) PostgreSQL itself, then checks
# formatting and lints, runs every test against real SQLite files and a real PostgreSQL, and
# fuzzes the live API against openapi.yaml with schemathesis.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "PostgreSQL"
admin_url=$(scripts/start-postgres.sh)
export AUGUR_TEST_POSTGRES_URL="$admin_url"
# Drop databases that earlier runs left (one is created per test, dropped when it ends; a
# killed run leaves its own): only those nobody is connected to and made over an hour ago, so
# that a run beside this one (another checkout's) keeps its databases.
runuser -u postgres -- psql -tAc "SELECT datname FROM pg_database d
    WHERE datname LIKE 'augur_test_%'
      AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)
      AND now() - (pg_stat_file('base/' || oid || '/PG_VERSION')).modification > interval '1 hour'" \
  | while read -r db; do [ -n "$db" ] && runuser -u postgres -- dropdb --if-exists "$db"; done

step "Slurm (scripts/start-slurm.sh)"
scripts/start-slurm.sh
export AUGUR_TEST_SLURM=1

step "Podman and its base image (scripts/podman-setup.sh; cached under target/podman)"
scripts/podman-setup.sh >/dev/null

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test"
mkdir -p target
cargo test --workspace --no-fail-fast 2>&1 | tee target/test-output.txt
# a closing line for the record: totals over every test binary
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, i }' target/test-output.txt

step "deploy/: manifests, service image, compose (scripts/deploy-test.sh)"
# The debug binary `cargo test` built: a release build would add 15+ minutes to CI.
AUGUR_DEPLOY_PROFILE=debug scripts/deploy-test.sh

step "Python client against a live server (scripts/python-client-test.sh)"
scripts/python-client-test.sh

step "Vertex AI Vizier SDK against a live server (scripts/vizier-sdk-test.sh)"
scripts/vizier-sdk-test.sh

step "Optuna's GrpcStorageProxy against a live server (scripts/optuna-grpc-test.sh)"
scripts/optuna-grpc-test.sh

step "dashboard in headless Chromium (scripts/browser-test.sh)"
# The debug binary `cargo test` already built: a release build would add ~10 minutes to CI.
# Timings quoted in notes come from `scripts/browser-test.sh` run alone (release).
AUGUR_BROWSER_PROFILE=debug scripts/browser-test.sh

step "schemathesis against openapi.yaml"
scripts/schemathesis.sh
