#!/usr/bin/env bash
# build-image.sh [IMAGE]: builds idemd's image offline with buildah, nothing
# pulled: scripts/image-rootfs.sh lays out its file system on this machine
# (static binaries, Debian's CA certificates and time zone data), and the
# image stage of deploy/Dockerfile (its last FROM scratch to the end, so the
# same USER, ENTRYPOINT and CMD) is built from it. IMAGE defaults to
# $IMAGE, then localhost/idemd:dev; PLATFORMS (below) chooses the
# architectures. `make image` runs it after
# scripts/ensure-buildah.sh. `build-image.sh --containerfile` prints the
# image stage it builds, and `build-image.sh --build-args` the values of its
# ARGs (the labels' version and revision, as the binaries are stamped:
# scripts/buildinfo.sh); both build nothing.
#
# The image's timestamps are the last commit's, so the same tree gives the
# same image ID and an unchanged rebuild adds nothing to storage.
set -euo pipefail
cd "$(dirname "$0")/.."

# containerfile prints the image stage of deploy/Dockerfile, its file
# system taken from the build context's rootfs/ instead of the build stage.
containerfile() {
  local stage
  stage=$(awk '/^FROM /{stage=""} {stage = stage $0 "\n"} END {printf "%s", stage}' deploy/Dockerfile |
    sed 's#^COPY --from=build /rootfs/ /$#COPY rootfs/ /#')
  if ! grep -q '^FROM scratch$' <<<"$stage" || ! grep -q '^COPY rootfs/ /$' <<<"$stage" ||
    grep -q -- '--from=' <<<"$stage"; then
    echo "build-image: deploy/Dockerfile's last stage is not FROM scratch with COPY --from=build /rootfs/ /:" >&2
    echo "$stage" >&2
    return 1
  fi
  echo "$stage"
}

# buildargs prints the image stage's ARGs, one NAME=value a line.
buildargs() {
  echo "VERSION=$(scripts/buildinfo.sh version)"
  echo "REVISION=$(scripts/buildinfo.sh commit)"
}

# --containerfile, --build-args: print what would be built, build nothing
# (for deploy/dockerfile_test.go).
case "${1:-}" in
--containerfile)
  containerfile
  exit
  ;;
--build-args)
  buildargs
  exit
  ;;
esac

image=${1:-${IMAGE:-localhost/idemd:dev}}
if ! command -v buildah >/dev/null; then
  echo "build-image: no buildah on this machine: run scripts/ensure-buildah.sh" >&2
  exit 1
fi
# PLATFORMS: the platforms to build, by default this machine's alone. Each
# is the same FROM scratch image with its own architecture's binaries
# (GOARCH, cross-compiled: nothing of the image stage runs, so no emulator
# is needed); two or more make $image an OCI image index (manifest list)
# of them, each also tagged $image-<arch>.
read -r -a platforms <<<"${PLATFORMS:-linux/$(go env GOARCH)}"

work=$(mktemp -d "${TMPDIR:-/tmp}/idemd-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
containerfile >"$work/Containerfile"
args=()
while read -r arg; do
  args+=(--build-arg "$arg")
done < <(buildargs)
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)

# build PLATFORM TAG: one platform's image, tagged TAG. The image this tag
# named before is left untagged: remove it unless a container or another
# tag still uses it.
build() {
  local platform=$1 tag=$2 arch=${1#linux/} previous
  case "$platform" in linux/amd64 | linux/arm64) ;; *)
    echo "build-image: platform $platform: only linux/amd64 and linux/arm64 are built" >&2
    return 1
    ;;
  esac
  mkdir -p "$work/$arch"
  GOARCH=$arch scripts/image-rootfs.sh "$work/$arch/rootfs"
  previous=$(buildah images --noheading --format '{{.ID}}' "$tag" 2>/dev/null || true)
  buildah build --quiet --layers=false --timestamp "$epoch" --platform "$platform" "${args[@]}" \
    -f "$work/Containerfile" -t "$tag" "$work/$arch" >/dev/null
  if [ -n "$previous" ] && [ "$previous" != "$(buildah images --noheading --format '{{.ID}}' "$tag")" ]; then
    buildah rmi "$previous" >/dev/null 2>&1 || true
  fi
  echo "build-image: $tag $platform $(buildah images --noheading --format '{{.ID}} {{.Size}}' "$tag" | head -1)" >&2
}

if [ "${#platforms[@]}" -eq 1 ]; then
  # A list left by a multi-platform build under this name goes first.
  buildah manifest rm "$image" >/dev/null 2>&1 || true
  build "${platforms[0]}" "$image"
  exit
fi
for p in "${platforms[@]}"; do
  build "$p" "$image-${p#linux/}"
done
# The index names the per-platform images by digest; rebuilt, it is made
# anew (an image under this name from a one-platform build goes first).
buildah manifest rm "$image" >/dev/null 2>&1 || buildah rmi "$image" >/dev/null 2>&1 || true
buildah manifest create "$image" >/dev/null
for p in "${platforms[@]}"; do
  buildah manifest add "$image" "containers-storage:$image-${p#linux/}" >/dev/null
done
echo "build-image: $image, an index of ${platforms[*]}" >&2
