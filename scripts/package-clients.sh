#!/usr/bin/env bash
# package-clients.sh OUTDIR [VERSION]: builds the replay verifiers'
# packages from clients/ with each ecosystem's own tool, offline, into
# OUTDIR:
#
#   idemd-replayauth-<gem version>.gem      gem build
#   idemd_replayauth-<pep 440>.tar.gz, ...-py3-none-any.whl   python3 -m build
#   idemd-replayauth-<npm version>.tgz      npm pack
#
# VERSION defaults to scripts/buildinfo.sh's. A release X.Y.Z is X.Y.Z in
# every ecosystem; a development build X.Y.Z-dev+<commit> becomes what each
# ecosystem accepts for it: gem X.Y.Z.dev.g<commit>, Python
# X.Y.Z.dev0+g<commit> (a local version), npm X.Y.Z-dev.g<commit> (with "."
# for "-" in the commit, each ecosystem's separator; "g" as in git
# describe, so that an all-digit hash is no number to npm). The sources keep the
# VERSION file's release (clients' TestPackages checks them); the packages
# are built from a copy with the version set, so nothing is edited in
# place. scripts/release.sh runs this; docs/languages/* say how to install
# the packages.
set -euo pipefail
out=${1:?usage: package-clients.sh OUTDIR [VERSION]}
cd "$(dirname "$0")/.."
root=$PWD
version=${2:-$(scripts/buildinfo.sh version)}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [[ "$version" =~ ^([0-9]+\.[0-9]+\.[0-9]+)$ ]]; then
  gem_v=$version py_v=$version npm_v=$version
elif [[ "$version" =~ ^([0-9]+\.[0-9]+\.[0-9]+)-dev\+([0-9A-Za-z.-]+)$ ]]; then
  base=${BASH_REMATCH[1]} local=g${BASH_REMATCH[2]//-/.}
  gem_v=$base.dev.$local py_v=$base.dev0+$local npm_v=$base-dev.$local
else
  echo "package-clients: $version is neither X.Y.Z nor X.Y.Z-dev+<commit>" >&2
  exit 1
fi

# Debian's python3 has the build module (scripts/ensure-runtimes.sh:
# python3-build); a pyenv python3 earlier on PATH may not.
py=${PYTHON:-python3}
if [ -x /usr/bin/python3 ]; then
  py=${PYTHON:-/usr/bin/python3}
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/idemd-clients.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Ruby: gem build of a copy whose gemspec carries the version.
cp -r clients/ruby "$work/ruby"
sed -i -E "s/^(  s\.version = )\"[^\"]*\"/\1\"$gem_v\"/" "$work/ruby/idemd-replayauth.gemspec"
grep -q "s.version = \"$gem_v\"" "$work/ruby/idemd-replayauth.gemspec"
(cd "$work/ruby" && gem build --silent idemd-replayauth.gemspec --output "$out/idemd-replayauth-$gem_v.gem" >/dev/null)

# Python: the sdist and the wheel, with the build tools installed, offline.
mkdir "$work/python"
cp -r clients/python/pyproject.toml clients/python/idemd_replayauth "$work/python/"
sed -i -E "s/^version = \"[^\"]*\"/version = \"$py_v\"/" "$work/python/pyproject.toml"
grep -q "^version = \"$py_v\"" "$work/python/pyproject.toml"
(cd "$work/python" && "$py" -m build --no-isolation --sdist --wheel --outdir "$out" . >/dev/null)

# Node: npm pack of a copy with the version set and "private" removed: the
# source keeps "private" so that nobody publishes a checkout by accident;
# the release publishes this tarball.
cp -r clients/node "$work/node"
rm -rf "$work/node/example" "$work/node/test" "$work/node/node_modules"
(cd "$work/node" && NPM_V=$npm_v node -e '
  const fs = require("fs");
  const p = JSON.parse(fs.readFileSync("package.json"));
  p.version = process.env.NPM_V;
  delete p.private;
  fs.writeFileSync("package.json", JSON.stringify(p, null, 2) + "\n");')
(cd "$work/node" && npm_config_offline=true npm pack --silent --pack-destination "$out" >/dev/null)

echo "package-clients: $version as gem $gem_v, python $py_v, npm $npm_v in $out" >&2
