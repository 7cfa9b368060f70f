#!/usr/bin/env bash
# Black-box A/B of issue 11's bad days: OLD_REV (default 148ccc3, release 1's
# storage code) against this tree. Checks OLD_REV out as a detached git worktree
# with its own venv (kept under /tmp/mc-ab/trees for the next run), runs the same
# probes against both through public surfaces only (serve processes, grpcurl,
# grpc-health-probe, the CLI, a real redis-server per probe, the CQL node at
# MC_AB_CQL_CONTACT, default 127.0.0.1:40011) and prints one row per defect.
# Exit 0 only when every probe FAILS on the old tree and PASSES on this one.
#
#   scripts/ab-bad-days.sh [OLD_REV] [--only 1,5w] [--fresh] [--no-keep] [--workdir DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
# The venv, redis-server, faketime, grpcurl and grpc-health-probe (quiet unless it fails).
if ! setup_log=$(scripts/setup.sh 2>&1); then
  printf '%s\n' "$setup_log" >&2
  exit 2
fi
exec .venv/bin/python -m tests.ab.bad_days "$@"
