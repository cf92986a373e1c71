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
#   build/release/idemd_<v>_image_linux_<arch>.cdx.json
#                                       a CycloneDX SBOM of the image of each
#                                       architecture (syft, from the image archive)
#   build/release/idemd-<v>.tgz         the Helm chart (`helm package`), its
#                                       version and appVersion the release's
#   build/release/idemd-chart_<v>.oci.tar  the chart as the OCI artifact `helm
#                                       push` makes of it, in an OCI image
#                                       layout (tar): what the workflow copies
#                                       to ghcr.io/idemd/charts/idemd and signs
#   build/release/idemd-replayauth-*    the gem, the Python sdist and wheel and
#                                       the npm tarball (scripts/package-clients.sh)
#
# The archives also hold the manifests (deploy/: base, components, overlays,
# observability, the Flux example, the chart's source) and docs/.
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
# GoReleaser and cyclonedx-gomod are tools of tools/go.mod, syft and oras of
# tools/oci/go.mod, helm (and chartoci) of deploy/helm/go.mod, whose Helm
# library the chart's tests use: all built into bin/tools/ (Go's build cache
# makes a rebuild quick).
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
(cd tools/oci && GOBIN="$root/bin/tools" go install tool)
(cd deploy/helm && GOBIN="$root/bin/tools" go install tool && GOBIN="$root/bin/tools" go install ./chartoci)
export PATH="$root/bin/tools:$PATH"

rm -rf build/release
mkdir -p build/release
# The image: both architectures, as one index, written as an OCI archive so
# it can be loaded where no registry is reachable (skopeo copy, podman load).
tag=${version//+/_}
image=localhost/idemd:$tag
PLATFORMS="linux/amd64 linux/arm64" scripts/build-image.sh "$image"
buildah manifest push --quiet --all --format oci "$image" "oci-archive:build/release/idemd_${version}_image.oci.tar:$tag"
# The image's SBOM, one per architecture, read from the image archive as a
# registry would serve it: what each binary linked (Go's module
# information) and the files laid out by scripts/image-rootfs.sh. Offline:
# syft looks for no update and needs no database.
for arch in amd64 arm64; do
  SYFT_CHECK_FOR_APP_UPDATE=false syft scan --quiet --platform "linux/$arch" \
    --source-name ghcr.io/idemd/idemd --source-version "$tag" \
    -o "cyclonedx-json=build/release/idemd_${version}_image_linux_${arch}.cdx.json" \
    "oci-archive:build/release/idemd_${version}_image.oci.tar"
done
scripts/package-clients.sh build/release "$version"

# The chart, versioned as the release; its appVersion (the default image
# tag) is the image's tag. Then the OCI artifact `helm push` would make of
# it, in a layout, created at the commit's time so a rebuild gives the same
# digest: the workflow copies this very artifact to the registry and signs
# its digest (.github/workflows/release.yml).
helm package deploy/helm/idemd --version "$version" --app-version "$tag" -d build/release >/dev/null
chart_layout=$(mktemp -d)
created=$(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ)
chartoci -chart "build/release/idemd-$version.tgz" -layout "$chart_layout" -created "$created" >/dev/null
tar -C "$chart_layout" -cf "build/release/idemd-chart_${version}.oci.tar" .
rm -rf "$chart_layout"

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
