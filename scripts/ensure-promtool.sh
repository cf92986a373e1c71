#!/usr/bin/env bash
# Makes sure `promtool` is on PATH: the alert tests (deploy/alerts_test.go)
# run `promtool check rules` and `promtool test rules` on the PrometheusRule.
# Debian ships promtool only inside its `prometheus` package, which also
# installs (and on a systemd machine starts) a Prometheus server; the tests
# need none, so the server is kept from starting and stopped if it did.
set -euo pipefail

if command -v promtool >/dev/null; then
  exit 0
fi

echo "ensure-promtool: no promtool on this machine; installing Debian's prometheus" >&2
export DEBIAN_FRONTEND=noninteractive

# policy-rc.d exit 101 tells invoke-rc.d/deb-systemd-invoke not to start the
# package's service during the install. Docker images usually have one; only
# a file this script created is removed again.
policy=/usr/sbin/policy-rc.d
created_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  created_policy=1
fi
cleanup() { if [ -n "$created_policy" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT

apt-get update -qq
# No recommends: prometheus-node-exporter would be one more daemon.
apt-get install -y -qq --no-install-recommends prometheus >/dev/null

# Belt and braces: a machine whose init ignored policy-rc.d may have started
# the server anyway. Stop it and keep it from starting at boot.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
elif [ -x /etc/init.d/prometheus ]; then
  /etc/init.d/prometheus stop >/dev/null 2>&1 || true
fi

if ! command -v promtool >/dev/null; then
  echo "ensure-promtool: the prometheus package installed no promtool on PATH" >&2
  exit 1
fi
promtool --version 2>&1 | head -1 >&2
