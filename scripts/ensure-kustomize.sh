#!/usr/bin/env bash
# Makes sure a kustomize v5 renderer is on this machine for the deploy tests
# (deploy/images_test.go renders every overlay with the binary operators
# run, besides the Go library): `kubectl kustomize` when kubectl embeds
# kustomize v5, else the kustomize CLI, built from the Go module proxy at
# the version whose library go.mod pins (sigs.k8s.io/kustomize/api v0.21.2).
# Debian's kubernetes-client is not used: it is kubectl 1.20, whose
# kustomize v2 cannot render components or targeted patches.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v kubectl >/dev/null 2>&1; then
	kv="$(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\{0,1\}//p')"
	case "$kv" in
	5.* | [6-9].*) exit 0 ;;
	esac
fi
gobin="$(go env GOPATH)/bin"
if [ -x "$gobin/kustomize" ] || command -v kustomize >/dev/null 2>&1; then
	exit 0
fi
echo "ensure-kustomize: no kubectl with kustomize v5; building the kustomize CLI into $gobin" >&2
go install sigs.k8s.io/kustomize/kustomize/v5@v5.8.2
"$gobin/kustomize" version >&2
