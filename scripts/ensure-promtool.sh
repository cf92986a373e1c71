#!/usr/bin/env bash
# Makes sure `promtool` is on PATH: the alert tests (deploy/alerts_test.go)
# run `promtool check rules` and `promtool test rules` on the PrometheusRule.
# Debian ships promtool only inside its `prometheus` package, whose
# Prometheus server is kept from running.
set -euo pipefail

if command -v promtool >/dev/null; then
  exit 0
fi
echo "ensure-promtool: no promtool on this machine; installing Debian's prometheus" >&2
"$(dirname "$0")/install-debian-quietly.sh" prometheus prometheus

if ! command -v promtool >/dev/null; then
  echo "ensure-promtool: the prometheus package installed no promtool on PATH" >&2
  exit 1
fi
promtool --version 2>&1 | head -1 >&2
