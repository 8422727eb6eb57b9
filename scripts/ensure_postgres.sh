#!/usr/bin/env bash
# Make sure PostgreSQL server binaries (initdb, pg_ctl, postgres) exist for the tests, which start
# a private throwaway cluster of their own (no system cluster is touched).
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v pg_ctl >/dev/null; then
  echo "postgres: server binaries present"; exit 0
fi
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  echo "postgres: installing the postgresql package with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
  exit 0
fi
echo "postgres: server binaries missing; install PostgreSQL (e.g. 'sudo apt-get install -y postgresql')" >&2
exit 1
