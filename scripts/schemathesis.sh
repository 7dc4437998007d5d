#!/usr/bin/env bash
# Fuzz the running API against its committed OpenAPI document with Schemathesis: no 5xx, and
# every response's status code, content type, headers and body as the document says.
#
# Builds `augur`, serves it (with a bearer token) on a temp SQLite file and a free loopback
# port, creates studies and trials so that `{study}`/`{trial}` ids exist (the generator draws
# path ids from them most of the time), runs `schemathesis run openapi.yaml` twice with the
# admin's token (DELETE last, so that it cannot remove the seeded studies under the other
# operations), then a third time with a reader's token, where every change must be refused
# with 403 (a check of our own, `a_reader_changes_nothing`) and nothing may answer 5xx; exits
# non-zero on any finding.
#
# Environment (all optional):
#   SCHEMATHESIS_VENV          venv to create or reuse (default: $target/schemathesis-venv)
#   SCHEMATHESIS_MAX_EXAMPLES  test cases per operation (default 30)
#   SCHEMATHESIS_CHECKS        checks to run (default: the five conformance checks below;
#                              `all` adds e.g. negative_data_rejection, use_after_free)
#   SCHEMATHESIS_SEED          seed for a reproducible run (default 1)
#   SCHEMATHESIS_TIMEOUT       seconds before the whole run is cut off (default 900)
#   CARGO_TARGET_DIR           where cargo builds (default: ./target)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
venv=${SCHEMATHESIS_VENV:-$target/schemathesis-venv}
max_examples=${SCHEMATHESIS_MAX_EXAMPLES:-30}
checks=${SCHEMATHESIS_CHECKS:-not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance}
seed=${SCHEMATHESIS_SEED:-1}
run_timeout=${SCHEMATHESIS_TIMEOUT:-900}

if [ ! -x "$venv/bin/schemathesis" ]; then
  echo "creating $venv and installing schemathesis" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip >&2
  "$venv/bin/pip" install --quiet schemathesis >&2
fi
echo "using $("$venv/bin/schemathesis" --version)" >&2

(cd "$repo" && cargo build --quiet --bin augur)
augur="$target/debug/augur"

work=$(mktemp -d "${TMPDIR:-/tmp}/augur-schemathesis.XXXXXX")
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

spec="$repo/openapi.yaml"
if [ ! -f "$spec" ]; then
  echo "openapi.yaml is missing: using the document this build generates" >&2
  spec="$work/openapi.yaml"
  "$augur" openapi >"$spec"
fi

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base="http://127.0.0.1:$port"
# With a token, as deployed: the auth checks then test something, and the token travels in
# the environment, not on a command line.
token=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
AUGUR_TOKEN=$token AUGUR_LOG=warn "$augur" serve --database-url "sqlite://$work/augur.db" \
  --listen "127.0.0.1:$port" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 100); do
  curl -fsS "$base/readyz" >/dev/null 2>&1 && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; echo "augur serve exited" >&2; exit 1; }
  sleep 0.1
done
curl -fsS "$base/readyz" >/dev/null || { cat "$work/server.log" >&2; echo "augur serve is not ready" >&2; exit 1; }

# Seed data: studies 1-3 (active with trials in several states; completed; stopped).
post() {
  curl -fsS -X POST "$base$1" -H "authorization: Bearer $token" -H 'content-type: application/json' \
    -d "$2" >/dev/null
}
study='{"name": "fuzz", "algorithm": "random", "metrics": [{"id": "accuracy", "goal": "maximize"}],
  "parameters": [{"id": "lr", "type": "double", "min": 0.0001, "max": 1, "scale": "log"},
                 {"id": "layers", "type": "integer", "min": 1, "max": 8},
                 {"id": "kernel", "type": "categorical", "values": ["rbf", "poly"],
                  "children": [{"when": ["poly"], "parameters": [{"id": "degree", "type": "integer", "min": 2, "max": 5}]}]}],
  "max_trials": 1000, "parallel_trials": 10, "seed": 1}'
post /v1/studies "$study"
post /v1/studies/1/suggest '{"count": 3, "client_id": "w1"}'
post /v1/studies/1/trials/1/measurements '{"step": 1, "elapsed_secs": 1.5, "metrics": {"accuracy": 0.5}}'
post /v1/studies/1/trials/1/complete '{"metrics": {"accuracy": 0.7}}'
post /v1/studies/1/trials/2/measurements '{"step": 1, "metrics": {"accuracy": 0.4}}'
post /v1/studies/1/trials/3/fail '{"reason": "seeded failure"}'
post /v1/studies '{"name": "done", "algorithm": "random", "metrics": [{"id": "loss", "goal": "minimize"}],
  "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}], "max_trials": 1}'
post /v1/studies/2/suggest '{"count": 1}'
post /v1/studies/2/trials/1/complete '{"metrics": {"loss": 0.1}}'
post /v1/studies "$study"
post /v1/studies/3/stop '{}'
# A reader's token for the third pass (an admin's API; its secret is in the answer).
reader=$(curl -fsS -X POST "$base/v1/tokens" -H "authorization: Bearer $token" \
  -H 'content-type: application/json' -d '{"name": "fuzz-reader", "role": "reader"}' \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])')

# The reader pass's own check: a reader may read, and change nothing.
cat >"$work/reader_checks.py" <<'PY'
import os

import schemathesis

PUBLIC = {"/login", "/logout"}
READER = os.environ["AUGUR_FUZZ_READER"]


@schemathesis.check
def a_reader_changes_nothing(ctx, response, case):
    """Every change a reader's token asks for is refused with 403."""
    public = case.path in PUBLIC or case.path.startswith("/dashboard/") or case.path in ("/healthz", "/readyz")
    if case.method.upper() not in ("POST", "PUT", "PATCH", "DELETE") or public:
        return None
    # The coverage phase also sends cases without the token (401 is right for those).
    sent = response.request.headers.get("Authorization", "")
    if not sent.startswith("Bearer ") or sent != f"Bearer {READER}":
        return None
    if response.status_code != 403:
        raise AssertionError(
            f"{case.method} {case.path} with a reader's token answered {response.status_code}, not 403"
        )
    return None
PY

cat >"$work/schemathesis.toml" <<EOF
[dictionaries.study_ids]
values = ["1", "2", "3"]
[dictionaries.trial_ids]
values = ["1", "2", "3", "4"]
[parameters]
"path.study" = { dictionary = "study_ids", probability = 0.8 }
"path.trial" = { dictionary = "trial_ids", probability = 0.8 }
EOF

# Two passes, so that fuzzing DELETE does not remove the seeded studies under the others.
run_pass() {
  local name=$1 bearer=$2 pass_checks=$3
  shift 3
  echo "schemathesis ($name) against $base ($spec), checks: $pass_checks, max examples: $max_examples" >&2
  # From the temp dir: schemathesis keeps its example database in the working directory.
  (cd "$work" && PYTHONPATH="$work" SCHEMATHESIS_HOOKS=reader_checks AUGUR_FUZZ_READER="$reader" timeout "$run_timeout" \
    "$venv/bin/schemathesis" --config-file "$work/schemathesis.toml" run "$spec" \
    --url "$base" \
    --header "Authorization: Bearer $bearer" \
    --checks "$pass_checks" \
    --max-examples "$max_examples" \
    --seed "$seed" \
    --phases examples,coverage,fuzzing \
    --request-timeout 10 \
    --no-color \
    "$@")
}
status=0
# POST /login takes a browser form, not JSON: tests/api/login.rs covers it. A pool slot's lease
# is a long poll that answers when a trial is free or after wait_secs (up to 30 s, 20 by
# default), longer than a fuzzed request may take: tests/api/pools.rs covers it (the reader's
# pass still checks that it is refused).
run_pass "admin, all but DELETE" "$token" "$checks" --exclude-method DELETE --exclude-path /login \
  --exclude-path '/v1/pools/{pool}/workers/{worker}/lease' || status=$?
if [ "$status" -ne 124 ]; then
  run_pass "admin, DELETE" "$token" "$checks" --include-method DELETE || { s=$?; [ "$status" -eq 0 ] && status=$s; }
fi
if [ "$status" -ne 124 ]; then
  run_pass "reader" "$reader" "$checks,a_reader_changes_nothing" --exclude-path /login \
    || { s=$?; [ "$status" -eq 0 ] && status=$s; }
fi
if grep -q "panicked\|ERROR" "$work/server.log"; then
  echo "--- server log (errors) ---" >&2
  grep -n "panicked\|ERROR" "$work/server.log" | head -50 >&2
fi
[ "$status" -eq 124 ] && echo "schemathesis did not finish within ${run_timeout}s" >&2
exit "$status"
