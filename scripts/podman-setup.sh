#!/usr/bin/env bash
# Real OCI containers on this machine, offline (after ../shared/RUNBOOK.md's recipe): installs
# rootful Podman with runc when missing, keeps Podman's state under target/podman (its own
# storage and run roots, so /var/lib/containers is untouched), and builds the base image
# localhost/augur-base:bookworm (Debian + python3, from a root filesystem mmdebstrap makes once
# from the apt mirror: no registry is reachable). Idempotent: a second run finds it all.
#
# Prints, one per line, what a test or the container executor needs:
#   AUGUR_PODMAN_GLOBAL_ARGS=<podman options before `run`>   (space-separated)
#   AUGUR_PODMAN_RUN_ARGS=<options of `podman run`>           (space-separated)
#   AUGUR_BASE_IMAGE=localhost/augur-base:bookworm
# and, as "# " comments, the exact lines that build the example trainer image and run its
# study with this Podman (examples/container/).
set -euo pipefail
cd "$(dirname "$0")/.."
base="${AUGUR_PODMAN_DIR:-$PWD/target/podman}"
image="localhost/augur-base:bookworm"
mkdir -p "$base"
# Tests call this concurrently (one per container test): one at a time, or two installs race
# for apt's lock and two imports for the root filesystem, and every trial fails.
exec 9>"$base/setup.lock"
flock 9

pkgs=(podman runc catatonit mmdebstrap)
missing=()
# installed, not merely known (a removed package keeps a status: "deinstall ok config-files")
for p in "${pkgs[@]}"; do
  [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "podman-setup: installing ${missing[*]}" >&2
  # another script of the test run may hold apt's lock: wait for it rather than fail
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# This host lacks CAP_SYS_RESOURCE: Podman's default rlimits fail; ask for the hard limits.
nofile=$(ulimit -Hn); [[ $nofile == unlimited ]] && nofile=1048576
nproc=$(ulimit -Hu); [[ $nproc == unlimited ]] && nproc=1048576
((nproc > 32768)) && nproc=32768
# crun refuses this host's hybrid cgroups: runc; cgroupfs and file events need no systemd.
global=(--root "$base/storage" --runroot "$base/runroot" --runtime runc --cgroup-manager cgroupfs --events-backend file)
run=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")

if ! podman "${global[@]}" image exists "$image"; then
  if [[ ! -f $base/rootfs.tar ]]; then
    . /etc/os-release
    mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [[ -n $mirror ]] || mirror=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    [[ -n $mirror ]] || { echo "podman-setup: no Debian mirror in the apt sources" >&2; exit 1; }
    echo "podman-setup: building a $VERSION_CODENAME root filesystem with python3 (once)" >&2
    rm -f "$base/rootfs.partial.tar"
    mmdebstrap --quiet --variant=essential --include=python3,ca-certificates \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
      --format=tar "$VERSION_CODENAME" "$base/rootfs.partial.tar" "$mirror" >&2
    mv "$base/rootfs.partial.tar" "$base/rootfs.tar"
  fi
  podman "${global[@]}" import -q --change 'CMD ["python3"]' --change 'ENV PYTHONUNBUFFERED=1' \
    "$base/rootfs.tar" "$image" >/dev/null
fi
echo "AUGUR_PODMAN_GLOBAL_ARGS=${global[*]}"
echo "AUGUR_PODMAN_RUN_ARGS=${run[*]}"
echo "AUGUR_BASE_IMAGE=$image"
# For people: the commands that use this Podman, from the repository's root. Every podman call,
# the build included, needs the same storage options; augur takes each option as its own
# --container-engine-arg=--opt=value (and each `podman run` option as a --container-run-arg).
flags=""
for ((i = 0; i < ${#global[@]}; i += 2)); do flags+=" --container-engine-arg=${global[i]}=${global[i+1]}"; done
for ((i = 0; i < ${#run[@]}; i += 2)); do flags+=" --container-run-arg=${run[i]}=${run[i+1]}"; done
echo "# build the example trainer image (examples/container/Containerfile):"
echo "#   podman ${global[*]} build -t localhost/augur-quickstart:1 -f examples/container/Containerfile examples/quickstart"
echo "# run its study in containers (or give \`augur serve\` the same options):"
echo "#   cargo run --release -- run -f examples/container/study.yaml --container-engine podman$flags"
