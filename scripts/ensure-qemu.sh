#!/usr/bin/env bash
# Makes sure this machine runs linux/arm64 binaries, so the release test
# (internal/testing/releasetest) starts the arm64 binaries and the arm64
# image as well as the amd64 ones: Debian's qemu-user-static, registered
# with the kernel's binfmt_misc for aarch64 ELF files with the F flag (the
# interpreter is opened once, so it runs inside podman's containers too).
# On an arm64 machine nothing is needed.
#
# binfmt_misc is the kernel's, shared by the whole machine; the handler
# only adds the ability to run aarch64 binaries. Where it cannot be
# registered (a container without the privilege), the release test falls
# back to running the arm64 binaries with qemu-aarch64-static directly and
# says why the arm64 image did not start. With CI=true a missing
# qemu-aarch64-static fails this script.
set -euo pipefail
here=$(dirname "$0")

if [ "$(uname -m)" = aarch64 ]; then
  exit 0
fi
if ! command -v qemu-aarch64-static >/dev/null; then
  echo "ensure-qemu: installing Debian's qemu-user-static" >&2
  if ! "$here/install-debian-quietly.sh" qemu-user-static qemu-user-static || ! command -v qemu-aarch64-static >/dev/null; then
    if [ "${CI:-}" = true ]; then
      echo "ensure-qemu: could not install qemu-user-static; CI needs it to run the arm64 release artifacts" >&2
      exit 1
    fi
    echo "ensure-qemu: could not install qemu-user-static: the release test skips the arm64 runs" >&2
    exit 0
  fi
fi

misc=/proc/sys/fs/binfmt_misc
if [ -e "$misc/qemu-aarch64" ]; then
  exit 0
fi
if [ ! -e "$misc/register" ]; then
  mount -t binfmt_misc binfmt_misc "$misc" 2>/dev/null || true
fi
conf=/usr/lib/binfmt.d/qemu-aarch64.conf
if [ -w "$misc/register" ] && [ -r "$conf" ]; then
  # Debian's line, with the F flag; only the registration's own error
  # matters (one already there, registered meanwhile, is fine).
  cat "$conf" >"$misc/register" 2>/dev/null || [ -e "$misc/qemu-aarch64" ] || true
fi
if [ -e "$misc/qemu-aarch64" ]; then
  echo "ensure-qemu: aarch64 binaries run through $(sed -n 's/^interpreter //p' "$misc/qemu-aarch64")" >&2
else
  echo "ensure-qemu: binfmt_misc cannot be set up here: arm64 binaries run only through qemu-aarch64-static, and the arm64 image does not start" >&2
fi
