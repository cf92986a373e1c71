#!/usr/bin/env bash
# Makes sure the `pgbouncer` binary is on PATH: internal/pgbouncertest runs
# its own pgbouncer processes (as the postgres user, on free ports) between
# the tests and PostgreSQL. Debian's pgbouncer package also installs, and on a
# systemd machine starts, a system pgbouncer on port 6432; the tests need
# none, so that service is kept from starting and stopped if it did.
set -euo pipefail

# Debian puts it in /usr/sbin, which a non-root PATH may lack; the harness
# looks there too.
if command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; then
  exit 0
fi

echo "ensure-pgbouncer: no pgbouncer on this machine; installing Debian's pgbouncer" >&2
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
apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null

# A machine whose init ignored policy-rc.d may have started the system
# pgbouncer anyway. Stop it and keep it from starting at boot, so nothing
# holds port 6432 or server connections the tests' databases would wait on.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl disable --now pgbouncer.service >/dev/null 2>&1 || true
elif [ -x /etc/init.d/pgbouncer ]; then
  /etc/init.d/pgbouncer stop >/dev/null 2>&1 || true
fi

bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
if [ ! -x "$bin" ]; then
  echo "ensure-pgbouncer: the pgbouncer package installed no pgbouncer binary" >&2
  exit 1
fi
"$bin" --version 2>&1 | head -1 >&2
