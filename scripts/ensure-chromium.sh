#!/usr/bin/env bash
# Makes sure Debian's `chromium` and `chromedriver` are on PATH: the
# console's browser test (internal/console, TestBrowser) loads its pages in
# headless Chromium, checks the rendered DOM, and drives the browser through
# chromedriver's W3C WebDriver API to act on the console as a person would
# (fill a form, press its button). Neither has a service of its own; the
# helper is used for its quiet, no-recommends install. make unit and .ci/run
# call this, so with CI=true the browser test runs rather than skips.
set -euo pipefail

install() { # install COMMAND PACKAGE
  if command -v "$1" >/dev/null; then
    return 0
  fi
  echo "ensure-chromium: no $1 on this machine; installing Debian's $2" >&2
  "$(dirname "$0")/install-debian-quietly.sh" "$2" "$2"
  if ! command -v "$1" >/dev/null; then
    echo "ensure-chromium: the $2 package installed no $1 on PATH" >&2
    exit 1
  fi
  "$1" --version 2>&1 | head -1 >&2
}

install chromium chromium
install chromedriver chromium-driver
