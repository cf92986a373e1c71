#!/usr/bin/env bash
# Makes sure Debian's language runtimes for the other-language clients are
# there: clients' Go tests (TestRuby, TestPython, TestNode) and the
# cross-language end-to-end test (internal/testing/e2e/polyglot) run them, and with
# CI=true a missing one fails the tests.
#
#   ruby + ruby-pg              Rack middleware tests; minitest ships with ruby
#   ruby-webrick                the end-to-end Ruby API's HTTP server
#   ruby-sinatra + ruby-sequel  the Sinatra example (clients/ruby/example/sinatra) and its test
#   python3 + python3-psycopg2  WSGI/ASGI tests and the end-to-end Python API; the
#                               tests use Debian's /usr/bin/python3 ahead of
#                               any other python3 on PATH (pyenv)
#   python3-flask               the Flask example (clients/python/example) and its test
#   python3-pip                 builds clients/python's wheel offline (TestPackages; brings
#                               python3-setuptools and python3-wheel)
#   python3-build               the release's sdist and wheel (scripts/package-clients.sh,
#                               internal/testing/releasetest)
#   npm                         the release's npm tarball (npm pack)
#   nodejs                      Express/connect middleware tests (node:test);
#                               a node already on PATH is used as it is
#   postgresql-client           psql, the Node tests' PostgreSQL driver
#   npm ci (clients/node/example) express and pg for the Express example's test, from
#                               the npm registry at package-lock.json's versions
#                               (Debian's npm when no npm is on PATH)
#
# Only what is missing is installed, one package at a time through
# install-debian-quietly.sh. On this machine kind, from nothing: about 40 s
# (ruby, ruby-pg, python3-psycopg2); nothing when everything is there.
set -euo pipefail
here=$(dirname "$0")

install() {
  echo "ensure-runtimes: installing Debian's $1" >&2
  "$here/install-debian-quietly.sh" "$1" "$1"
}

if ! command -v ruby >/dev/null || ! ruby -e 'require "pg"; require "minitest"; require "openssl"; require "webrick"; require "sinatra/base"; require "sequel"' 2>/dev/null; then
  install ruby
  install ruby-pg
  install ruby-webrick
  install ruby-sinatra
  install ruby-sequel
fi
if ! /usr/bin/python3 -c 'import psycopg2' 2>/dev/null; then
  install python3-psycopg2
fi
if ! /usr/bin/python3 -c 'import flask' 2>/dev/null; then
  install python3-flask
fi
if ! /usr/bin/python3 -W ignore -c 'import setuptools, wheel, pip' 2>/dev/null; then
  install python3-pip
fi
if ! /usr/bin/python3 -W ignore -c 'import build' 2>/dev/null; then
  install python3-build
fi
if ! command -v node >/dev/null; then
  install nodejs
fi
if ! command -v npm >/dev/null; then
  install npm
fi
if ! command -v psql >/dev/null; then
  install postgresql-client
fi
example="$here/../clients/node/example"
if ! node -e 'for (const p of ["express", "pg"]) require.resolve(p, { paths: [process.argv[1]] })' "$example" 2>/dev/null; then
  command -v npm >/dev/null || install npm
  echo "ensure-runtimes: npm ci in clients/node/example" >&2
  (cd "$example" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

ok=1
ruby -e 'require "pg"; require "minitest"; require "openssl"; require "webrick"; require "sinatra/base"; require "sequel"' || { echo "ensure-runtimes: ruby with pg, minitest, webrick, sinatra and sequel missing" >&2; ok=0; }
/usr/bin/python3 -W ignore -c 'import psycopg2, flask, setuptools, wheel, pip, build' || { echo "ensure-runtimes: Debian's python3 with psycopg2, flask, pip, setuptools, wheel and build missing" >&2; ok=0; }
command -v npm >/dev/null || { echo "ensure-runtimes: npm missing" >&2; ok=0; }
node -e 'if (+process.versions.node.split(".")[0] < 18) process.exit(1)' || { echo "ensure-runtimes: node 18 or later missing" >&2; ok=0; }
command -v psql >/dev/null || { echo "ensure-runtimes: psql missing" >&2; ok=0; }
node -e 'for (const p of ["express", "pg"]) require.resolve(p, { paths: [process.argv[1]] })' "$example" || { echo "ensure-runtimes: express and pg missing in clients/node/example/node_modules" >&2; ok=0; }
[ "$ok" = 1 ] || exit 1
echo "ensure-runtimes: $(ruby -e 'print RUBY_VERSION') ruby, $(/usr/bin/python3 -c 'import sys; print(sys.version.split()[0])') python3, $(node --version) node" >&2
