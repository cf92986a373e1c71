#!/usr/bin/env bash
# Makes sure `buildah`, `podman` and `runc` are on PATH: scripts/build-image.sh
# builds the image offline with buildah (FROM scratch, nothing pulled), and
# the image test (internal/testing/imagetest) runs it with podman on runc (crun,
# podman's default, fails on this machine kind). Debian's packages; their
# services are kept from running.
#
# With CI=true a tool that cannot be installed fails this script (and so
# CI); otherwise it says so and exits 0, and the image test skips.
set -euo pipefail

missing() {
  local m=()
  for t in buildah podman runc; do
    command -v "$t" >/dev/null || m+=("$t")
  done
  echo "${m[*]}"
}

todo=$(missing)
if [ -z "$todo" ]; then
  exit 0
fi
echo "ensure-buildah: no $todo on this machine; installing Debian's packages" >&2
ok=1
for p in $todo; do
  # podman's package has podman.service (the API socket); the others none.
  "$(dirname "$0")/install-debian-quietly.sh" "$p" "$p" || ok=
done

todo=$(missing)
if [ -n "$todo" ] || [ -z "$ok" ]; then
  if [ "${CI:-}" = true ]; then
    echo "ensure-buildah: could not install ${todo:-buildah, podman or runc}; CI needs them for the image build and test" >&2
    exit 1
  fi
  echo "ensure-buildah: could not install ${todo:-buildah, podman or runc}: make image fails and the image test (internal/testing/imagetest) skips" >&2
  exit 0
fi
buildah --version >&2
podman --version >&2
runc --version 2>&1 | head -1 >&2
