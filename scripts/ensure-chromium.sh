#!/usr/bin/env bash
# Makes sure Debian's `chromium` is on PATH: the console's browser test
# (internal/console, TestBrowser) loads its pages in headless Chromium and
# checks the rendered DOM. Chromium has no service of its own; the helper is
# used for its quiet, no-recommends install.
set -euo pipefail

if command -v chromium >/dev/null; then
  exit 0
fi
echo "ensure-chromium: no chromium on this machine; installing Debian's chromium" >&2
"$(dirname "$0")/install-debian-quietly.sh" chromium chromium

if ! command -v chromium >/dev/null; then
  echo "ensure-chromium: the chromium package installed no chromium on PATH" >&2
  exit 1
fi
chromium --version 2>&1 | head -1 >&2
