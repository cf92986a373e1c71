#!/usr/bin/env bash
# buildinfo.sh version|commit|ldflags: what a build stamps into the binaries
# (internal/buildinfo), for `make build`, scripts/image-rootfs.sh (both image
# builds) and scripts/build-image.sh's image labels.
#
#   version  the VERSION file at the repository root
#   commit   $IDEMD_REVISION when set (deploy/Dockerfile's build stage has
#            no .git), else git's short hash of HEAD with "-dirty" when the
#            tree has changes, else "unknown"
#   ldflags  the -X flags that stamp both
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=github.com/idemd/idemd/internal/buildinfo

version() {
  local v
  v=$(tr -d '[:space:]' <VERSION)
  if [ -z "$v" ]; then
    echo "buildinfo: VERSION is empty" >&2
    return 1
  fi
  echo "$v"
}

commit() {
  if [ -n "${IDEMD_REVISION:-}" ]; then
    echo "$IDEMD_REVISION"
  elif rev=$(git rev-parse --short HEAD 2>/dev/null); then
    # Untracked files count as dirty too: they can be built into a binary.
    if [ -n "$(git status --porcelain 2>/dev/null)" ]; then
      rev+=-dirty
    fi
    echo "$rev"
  else
    echo unknown
  fi
}

case "${1:-}" in
version) version ;;
commit) commit ;;
ldflags) echo "-X $pkg.version=$(version) -X $pkg.commit=$(commit)" ;;
*)
  echo "usage: buildinfo.sh version|commit|ldflags" >&2
  exit 2
  ;;
esac
