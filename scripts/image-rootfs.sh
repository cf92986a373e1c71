#!/usr/bin/env bash
# image-rootfs.sh DEST: lays out the whole file system of idemd's image in
# DEST. It is the one list of what the image holds, run by both builds:
# deploy/Dockerfile's build stage (in golang's Debian image) and
# scripts/build-image.sh (offline, on this Debian machine), whose image
# stage (the same lines of deploy/Dockerfile) copies DEST to / FROM scratch.
#
#   /usr/local/bin/{enqueuer,completer,reaper,idemctl}  static (CGO_ENABLED=0), -trimpath
#   /usr/local/bin/rocketrides                         the example API (examples/rocketrides), which the dev overlay runs
#   /etc/ssl/certs/ca-certificates.crt                 Debian's CA bundle (TLS to PostgreSQL, the API)
#   /usr/share/zoneinfo/                               Debian's time zone data
#   /etc/passwd, /etc/group                            root and nonroot (65532), as distroless has
#
# Run from anywhere; the Go build uses this checkout.
set -euo pipefail
dest=${1:?usage: image-rootfs.sh DEST}
cd "$(dirname "$0")/.."
COMMANDS=(enqueuer completer reaper idemctl)
# Examples built the same way, so the dev overlay runs Rocket Rides from this
# image rather than from one of its own (a few MB more).
EXAMPLES=(examples/rocketrides/cmd/rocketrides)

for f in /etc/ssl/certs/ca-certificates.crt /usr/share/zoneinfo/UTC; do
  if [ ! -e "$f" ]; then
    echo "image-rootfs: $f is missing: install Debian's ca-certificates and tzdata" >&2
    exit 1
  fi
done

rm -rf "$dest"
mkdir -p "$dest/usr/local/bin" "$dest/etc/ssl/certs" "$dest/usr/share"
# Static, because the image has no libc; -trimpath: no build machine paths
# in stack traces; -s -w: no symbol table or DWARF (panics still name
# functions and lines); the version and commit stamped as by `make build`.
ldflags="-s -w $(scripts/buildinfo.sh ldflags)"
CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="$ldflags" -o "$dest/usr/local/bin/" "${COMMANDS[@]/#/./cmd/}" "${EXAMPLES[@]/#/./}"
cp /etc/ssl/certs/ca-certificates.crt "$dest/etc/ssl/certs/"
# Relative links (GB -> Europe/London) are kept; localtime points at the
# host's /etc/localtime and is left out: the image's zone is UTC unless TZ
# says otherwise.
cp -a /usr/share/zoneinfo "$dest/usr/share/"
rm -f "$dest/usr/share/zoneinfo/localtime"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$dest/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$dest/etc/group"
chmod -R u=rwX,go=rX "$dest"
