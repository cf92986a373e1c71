#!/usr/bin/env bash
# release.sh snapshot|publish: builds every artifact of a release into
# dist/ (GoReleaser's) and build/release/, the same set either way:
#
#   dist/idemd_<v>_<os>_<arch>.tar.gz   enqueuer, completer, reaper, idemctl for
#                                       linux and darwin, amd64 and arm64
#   dist/<cmd>_<v>_<os>_<arch>.cdx.json a CycloneDX SBOM of each binary
#   dist/checksums.txt                  sha256 of all of them and of build/release/*
#   build/release/idemd_<v>_image.oci.tar  the image, an OCI index of linux/amd64
#                                       and linux/arm64 (oci-archive)
#   build/release/idemd-replayauth-*    the gem, the Python sdist and wheel and
#                                       the npm tarball (scripts/package-clients.sh)
#
# The version is scripts/buildinfo.sh's: on a tag vX.Y.Z (which must be the
# VERSION file's), X.Y.Z; else <VERSION>-dev+<commit>.
#
#   snapshot  offline, nothing published: `make release-snapshot`, and the
#             release test (internal/testing/releasetest) checks what it built.
#   publish   on a tag, in .github/workflows/release.yml: also creates the
#             GitHub release with CHANGELOG.md's section as its notes and
#             every file above attached (needs GITHUB_TOKEN). The workflow
#             pushes the image, signs it and publishes the packages.
#
# GoReleaser and cyclonedx-gomod are tools of tools/go.mod, built into
# bin/tools/ (Go's build cache makes a rebuild quick).
set -euo pipefail
mode=${1:?usage: release.sh snapshot|publish}
cd "$(dirname "$0")/.."
root=$PWD

version=$(scripts/buildinfo.sh version)
commit=$(scripts/buildinfo.sh commit)
# Every step (the image build, the client packages) stamps these, not a
# commit made while the release builds.
export IDEMD_VERSION=$version IDEMD_COMMIT=$commit IDEMD_REVISION=$commit
case "$mode" in
snapshot) ;;
publish)
  if [[ "$version" == *-dev+* ]] || [[ "$commit" == *-dirty ]]; then
    echo "release: $version ($commit) is not a release: publish runs on a clean checkout of a tag vX.Y.Z" >&2
    exit 1
  fi
  ;;
*)
  echo "usage: release.sh snapshot|publish" >&2
  exit 2
  ;;
esac

echo "release: $mode of $version (commit $commit)" >&2
(cd tools && GOBIN="$root/bin/tools" go install tool)
export PATH="$root/bin/tools:$PATH"

rm -rf build/release
mkdir -p build/release
# The image: both architectures, as one index, written as an OCI archive so
# it can be loaded where no registry is reachable (skopeo copy, podman load).
tag=${version//+/_}
image=localhost/idemd:$tag
PLATFORMS="linux/amd64 linux/arm64" scripts/build-image.sh "$image"
buildah manifest push --quiet --all --format oci "$image" "oci-archive:build/release/idemd_${version}_image.oci.tar:$tag"
scripts/package-clients.sh build/release "$version"

notes=$(mktemp)
trap 'rm -f "$notes"' EXIT
# The release notes: the version's CHANGELOG section (for a snapshot, the
# one being prepared).
awk -v v="$version" '
  /^## \[/ { on = (index($0, "[" v "]") || (v ~ /-dev\+/ && index($0, "[Unreleased]"))) ; next }
  /^<!--|^\[[^]]*\]: / { on = 0 }
  on' CHANGELOG.md >"$notes"
if [ ! -s "$notes" ]; then
  echo "release: CHANGELOG.md has no section for $version" >&2
  exit 1
fi

if [ "$mode" = snapshot ]; then
  goreleaser release --snapshot --clean --release-notes "$notes"
else
  goreleaser release --clean --release-notes "$notes"
fi
echo "release: $version in dist/ and build/release/" >&2
