#!/usr/bin/env bash
# What each fault between machines costs, with two replicas and 32 clients (issue 32): runs the
# multi-node scenarios of tests/api/multi_node.rs (as root: network namespaces) with
# AUGUR_CLUSTER_CLIENTS busy clients (default 32) and prints, per scenario, the completion rate
# before and during the fault and the recovery time (fault healed -> a one-second window back
# at 90% of the rate before). The tests also check the invariants; a broken one fails this.
#   benches/multi_node.sh [CLIENTS]        # ~3 min after the build
set -euo pipefail
cd "$(dirname "$0")/.."
clients="${1:-${AUGUR_CLUSTER_CLIENTS:-32}}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
export AUGUR_TEST_POSTGRES_URL="${AUGUR_TEST_POSTGRES_URL:-postgres://postgres:postgres@127.0.0.1:5432/postgres}"
AUGUR_CLUSTER_CLIENTS="$clients" cargo test -q --test api multi_node -- \
  --test-threads=1 --nocapture > "$log" 2>&1 || { tail -40 "$log"; exit 1; }
echo "multi-node faults, 2 replicas, $clients busy clients (+3 on a budget study from the fault on)"
echo
echo "| scenario | fault held | completions/s before | during | recovery (healed -> 90% of before) |"
echo "|---|---:|---:|---:|---:|"
grep -o 'recovery-row | .*' "$log" | sed 's/^recovery-row //'
echo
echo "$(grep -cE '^ +\[ok\]' "$log") invariant checks held, none failed"
