#!/usr/bin/env bash
# buildinfo.sh version|commit|ldflags: what a build stamps into the binaries
# (internal/buildinfo), for `make build`, scripts/image-rootfs.sh (both image
# builds), scripts/build-image.sh's image labels and the release
# (scripts/release.sh, .goreleaser.yaml).
#
#   version  a release's version, or a development build's:
#            - $IDEMD_VERSION when set (the release workflow gives the tag's
#              version; deploy/Dockerfile's build stage its VERSION arg);
#            - else the tag vX.Y.Z on HEAD, when HEAD has one;
#            - else "<VERSION>-dev+<commit>": the VERSION file names the
#              release being prepared, and an untagged build is not it.
#            A release version must equal the VERSION file's: a tag that
#            does not is refused, so a binary, the image, the client
#            packages and the CHANGELOG cannot name different releases.
#   commit   $IDEMD_REVISION when set (deploy/Dockerfile's build stage has
#            no .git), else git's short hash of HEAD with "-dirty" when the
#            tree has changes, else "unknown"
#   ldflags  the -X flags that stamp both
set -euo pipefail
cd "$(dirname "$0")/.."
pkg=github.com/idemd/idemd/internal/buildinfo

file_version() {
  local v
  v=$(tr -d '[:space:]' <VERSION)
  if ! [[ "$v" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "buildinfo: VERSION holds \"$v\", not a release version X.Y.Z" >&2
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

version() {
  local want v
  want=$(file_version)
  v=${IDEMD_VERSION:-}
  v=${v#v}
  if [ -z "$v" ] && tag=$(git describe --tags --exact-match --match 'v[0-9]*' HEAD 2>/dev/null); then
    v=${tag#v}
  fi
  if [ -z "$v" ]; then
    echo "$want-dev+$(commit)"
    return
  fi
  # A development version passed on (the Dockerfile's VERSION arg from
  # `buildinfo.sh version`) is taken as it is when it is VERSION's.
  if [ "$v" != "$want" ] && ! [[ "$v" == "$want"-dev+* ]]; then
    echo "buildinfo: release $v is not the VERSION file's $want: set VERSION to the release before tagging it" >&2
    return 1
  fi
  echo "$v"
}

case "${1:-}" in
version) version ;;
commit) commit ;;
ldflags)
  # Computed first, so that a refused version fails this script.
  v=$(version)
  c=$(commit)
  echo "-X $pkg.version=$v -X $pkg.commit=$c"
  ;;
*)
  echo "usage: buildinfo.sh version|commit|ldflags" >&2
  exit 2
  ;;
esac
