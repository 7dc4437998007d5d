#!/usr/bin/env bash
# Start this machine's PostgreSQL for the tests (installing it when missing) and print the
# admin URL the tests use to create one database per test. Idempotent.
set -euo pipefail
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  echo "installing PostgreSQL" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi
version=$(pg_lsclusters -h | awk 'NR==1{print $1}')
cluster=$(pg_lsclusters -h | awk 'NR==1{print $2}')
if [ -z "$version" ]; then
  version=$(ls /usr/lib/postgresql | sort -n | tail -1); cluster=main
  pg_createcluster "$version" "$cluster" >&2
fi
# stdout is the URL this script prints: everything else goes to stderr
pg_ctlcluster "$version" "$cluster" start >&2 2>&1 || true
for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 && break; sleep 0.2; done
pg_isready -q -h 127.0.0.1 || { echo "PostgreSQL did not start" >&2; exit 1; }
runuser -u postgres -- psql -qc "ALTER USER postgres PASSWORD 'postgres'" >&2
# enough connections for two servers, the store's pools and the concurrency tests
current=$(runuser -u postgres -- psql -tAc "SHOW max_connections")
if [ "$current" -lt 300 ]; then
  runuser -u postgres -- psql -qc "ALTER SYSTEM SET max_connections = 300" >&2
  pg_ctlcluster "$version" "$cluster" restart >&2
  for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 && break; sleep 0.2; done
fi
echo "postgres://postgres:postgres@127.0.0.1:5432/postgres"
