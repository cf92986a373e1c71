#!/usr/bin/env bash
# install-debian-quietly.sh PACKAGE SERVICE: installs a Debian package whose
# binary the tests run themselves, without letting the package's own service
# (which installing it would start on a systemd machine) run: the tests need
# none, and it would hold a port or server connections. Used by
# ensure-pgbouncer.sh and ensure-promtool.sh.
set -euo pipefail
package=$1 service=$2
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

# Another install on the machine (a second checkout's) holds dpkg's lock for
# a while: wait for it instead of failing.
apt-get -o DPkg::Lock::Timeout=300 update -qq
# No recommends: prometheus would bring prometheus-node-exporter, one more daemon.
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "$package" >/dev/null

# A machine whose init ignored policy-rc.d may have started the service
# anyway. Stop it and keep it from starting at boot.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
  systemctl disable --now "$service.service" >/dev/null 2>&1 || true
elif [ -x "/etc/init.d/$service" ]; then
  "/etc/init.d/$service" stop >/dev/null 2>&1 || true
fi
