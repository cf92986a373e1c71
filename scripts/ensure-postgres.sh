#!/usr/bin/env bash
# Makes sure a PostgreSQL server answers on 127.0.0.1:5432 with trust auth for
# the postgres user: the machine's Debian cluster is started if it is down,
# and installed first if this machine has none.
set -euo pipefail

ready() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }

if command -v pg_isready >/dev/null && ready; then
  exit 0
fi

if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  echo "ensure-postgres: no PostgreSQL cluster on this machine; installing Debian's postgresql" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq postgresql >/dev/null
  ver=$(ls /etc/postgresql | sort -V | tail -1)
  # Trust auth on loopback for the tests, as on the machines of this kind.
  hba=/etc/postgresql/$ver/main/pg_hba.conf
  sed -i -E 's/^(host\s+all\s+all\s+127\.0\.0\.1\/32\s+)\S+/\1trust/; s/^(local\s+all\s+postgres\s+)\S+/\1trust/; s/^(local\s+all\s+all\s+)\S+/\1trust/; s/^(host\s+all\s+all\s+::1\/128\s+)\S+/\1trust/' "$hba"
fi

ver=$(ls /etc/postgresql | sort -V | tail -1)
echo "ensure-postgres: starting PostgreSQL $ver" >&2
pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
for _ in $(seq 1 60); do
  if ready; then exit 0; fi
  sleep 0.5
done
echo "ensure-postgres: PostgreSQL did not come up on 127.0.0.1:5432" >&2
exit 1
