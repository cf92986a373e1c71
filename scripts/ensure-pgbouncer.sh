#!/usr/bin/env bash
# Makes sure the `pgbouncer` binary is on PATH: internal/testing/pgbouncertest runs
# its own pgbouncer processes (as the postgres user, on free ports) between
# the tests and PostgreSQL. The package's system pgbouncer (port 6432) is
# kept from running.
set -euo pipefail

# Debian puts it in /usr/sbin, which a non-root PATH may lack; the harness
# looks there too.
if command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; then
  exit 0
fi
echo "ensure-pgbouncer: no pgbouncer on this machine; installing Debian's pgbouncer" >&2
"$(dirname "$0")/install-debian-quietly.sh" pgbouncer pgbouncer

bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
if [ ! -x "$bin" ]; then
  echo "ensure-pgbouncer: the pgbouncer package installed no pgbouncer binary" >&2
  exit 1
fi
"$bin" --version 2>&1 | head -1 >&2
