#!/usr/bin/env bash
# Validate Kubernetes manifests against the official schemas, offline: `kubernetes-validate` from
# PyPI (it ships the schemas of every Kubernetes release) in a virtual environment made once and
# kept in target/kubernetes-validate-venv. Usage: scripts/kubernetes-validate.sh FILE… (YAML or
# JSON, several documents per file allowed). KUBERNETES_VERSION picks the schemas (default 1.33.0,
# the oldest release the executor's API types target). Exits non-zero on the first invalid file.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${AUGUR_KUBERNETES_VALIDATE_VENV:-$PWD/target/kubernetes-validate-venv}"
want="kubernetes-validate==1.37.0"
if [ ! -f "$venv/.complete" ] || [ "$(cat "$venv/.complete")" != "$want" ]; then
  echo "kubernetes-validate: installing $want into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$want" >&2
  echo "$want" > "$venv/.complete"
fi
exec "$venv/bin/kubernetes-validate" --strict --kubernetes-version "${KUBERNETES_VERSION:-1.33.0}" "$@"
