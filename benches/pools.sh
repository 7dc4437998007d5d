#!/usr/bin/env bash
# Worker pools (issue 31): slot freed -> next trial started on `augur worker --pool`
# (3 workers x 4 slots, 10 studies), against the server's local dispatcher and a fresh
# worker process per trial; prints a table. See benches/pools.py for what each row measures.
#
#   cargo build --release && benches/pools.sh
#
# Environment: AUGUR_BIN (default: the release build under CARGO_TARGET_DIR or target/),
# AUGUR_BENCH_TRIAL_SECS (0.3), AUGUR_BENCH_TRIALS_PER_STUDY (24), AUGUR_BENCH_FRESH (10),
# AUGUR_BENCH_DATABASE (a postgres:// URL; default a fresh SQLite file per row).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${AUGUR_BIN:-${CARGO_TARGET_DIR:-$root/target}/release/augur}
if [[ ! -x $bin ]]; then
    echo "no augur binary at $bin: cargo build --release, or set AUGUR_BIN" >&2
    exit 1
fi
exec python3 "$root/benches/pools.py" "$bin"
