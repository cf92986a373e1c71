#!/usr/bin/env bash
# make deploy-check: render every kustomization under deploy/ and check it.
#
# 1. `kubectl kustomize` on each overlay, when a kubectl with kustomize v5 is
#    installed: the renderer operators actually use.
# 2. `go test ./deploy`, always: renders the same overlays with the kustomize
#    library (sigs.k8s.io/kustomize/api, pinned in go.mod), decodes every
#    object strictly into the Kubernetes API types, checks the security and
#    scheduling policies, and checks every flag and IDEMD_* variable against
#    the real commands' --help.
#
# kubectl is optional here. Debian's kubernetes-client package is not
# installed as a fallback: it is kubectl 1.20, whose embedded kustomize v2
# cannot render these kustomizations (components, patches with targets,
# generator options), so it would only produce false failures. The Go test's
# image check (deploy/images_test.go) also renders with a kustomize v5
# binary, kubectl's or the kustomize CLI scripts/ensure-kustomize.sh builds,
# which `make deploy-check` runs first.
set -euo pipefail
cd "$(dirname "$0")/.."

dirs=(deploy/base deploy/overlays/dev deploy/overlays/production deploy/observability)
out="${DEPLOY_CHECK_OUT:-$(mktemp -d)}"
mkdir -p "$out"

kubectl_ok=false
if command -v kubectl >/dev/null 2>&1; then
	kv="$(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\{0,1\}//p')"
	case "$kv" in
	5.* | [6-9].*) kubectl_ok=true ;;
	*) echo "deploy-check: kubectl's kustomize is '${kv:-unknown}', older than v5; using the Go renderer only" ;;
	esac
else
	echo "deploy-check: kubectl not found; rendering with the Go renderer (kustomize api, go test ./deploy) only"
fi

if $kubectl_ok; then
	for d in "${dirs[@]}"; do
		f="$out/$(echo "${d#deploy/}" | tr / -).yaml"
		if ! kubectl kustomize "$d" >"$f"; then
			echo "deploy-check: kubectl kustomize $d failed" >&2
			exit 1
		fi
		echo "deploy-check: kubectl kustomize $d: $(grep -c '^kind:' "$f") objects -> $f"
	done
fi

# The Go renderer writes its output next to kubectl's (go-*.yaml).
DEPLOY_CHECK_OUT="$out" go test -count=1 ./deploy
# The Helm chart, rendered and compared with the kustomize base (a module of
# its own: deploy/helm/go.mod).
(cd deploy/helm && go test -count=1 ./...)
echo "deploy-check: ok (rendered manifests in $out)"
