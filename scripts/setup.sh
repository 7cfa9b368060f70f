#!/usr/bin/env bash
# Installs everything the service and its tests need on a fresh Debian machine:
# a virtualenv with the project and its dev tools, redis-server, promtool, tmux
# (the terminal chat's test drives two panes), faketime (scripts/ab-bad-days.sh
# runs a replica with a fast clock), and the command-line tools the tests use
# (buf, grpcurl, grpc-health-probe, hadolint). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v faketime >/dev/null 2>&1 || need_apt+=(faketime)
command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)  # the terminal chat's test drives two panes
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} with apt-get"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# Debian's redis-server package starts a system instance; the tests start their own.
if command -v systemctl >/dev/null 2>&1; then systemctl stop redis-server >/dev/null 2>&1 || true; fi

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# The runtime dependencies come from requirements.lock (exact versions and hashes, as the
# image installs them), so the tests run what production runs; the project and its dev
# tools install on top, and pip keeps the locked versions because they satisfy its ranges.
stamp=.venv/.installed-$(cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q --require-hashes --only-binary=:all: -r requirements.lock
  .venv/bin/pip install -q -e '.[dev]'
  # a dev tool's own requirements must not move a locked package (a newer
  # grpcio-tools once lifted grpcio above the lock): the tests would not run
  # what production runs
  .venv/bin/python -m toolkit.lockcheck requirements.lock
  rm -f .venv/.installed-*
  touch "$stamp"
fi

if [ -x scripts/install-tools.sh ]; then
  scripts/install-tools.sh
fi
