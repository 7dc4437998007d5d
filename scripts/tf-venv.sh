#!/usr/bin/env bash
# A Python virtual environment with TensorFlow (CPU), tf-keras and cloudml-hypertune for the distributed
# example's end-to-end test (tests/jobs/tensorflow.rs), and TensorBoard (no longer a TensorFlow
# dependency) for `augur tensorboard`'s (tests/jobs/tensorboard.rs). Made once, kept in target/tf-venv (a
# second run finds it; ~280 MB download the first time). Prints the interpreter's path.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${AUGUR_TF_VENV:-$PWD/target/tf-venv}"
want="tensorflow-cpu==2.21.* tf-keras==2.21.* cloudml-hypertune==0.1.0.dev6 tensorboard==2.21.*"
# Several tests in one binary run this at once: without the lock each would remove and refill the
# same venv under the others (pip then reads half-written metadata and fails).
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [ ! -f "$venv/.complete" ] || [ "$(cat "$venv/.complete")" != "$want" ]; then
  echo "tf-venv: installing $want into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check $want >&2
  echo "$want" > "$venv/.complete"
fi
echo "$venv/bin/python"
