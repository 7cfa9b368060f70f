#!/usr/bin/env bash
# The whole test suite, as CI runs it: setup, generated-code check, buf lint
# and breaking-change check of the protos, lint, types, then every test (unit, conformance on memory + a real redis-server +
# a real CQL node, end-to-end over real gRPC, deploy checks).
# Extra arguments go to pytest, e.g. scripts/test.sh -m redis (MC_TEST_WORKERS=0 for one
# process, e.g. to use pdb)
# Without arguments the cases marked both `cluster` and `slow` (the two-DC demonstration,
# several minutes of node restarts) are left out; run them with -m "cluster and slow".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.tools/bin:$PWD/.tools/node_modules/.bin:$PATH"

echo "== generated code is current"
if [ -f protos/generate.py ]; then .venv/bin/python protos/generate.py --check; fi
echo "== buf lint, and buf breaking against release 1's protos (protos/releases/r1)"
(cd protos && buf lint && buf breaking --against releases/r1)
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy"
.venv/bin/mypy
echo "== go vet + go test (the nemesis's porcupine checker)"
(cd toolkit/nemesis/porcupine && GOFLAGS=-mod=mod go vet ./... && GOFLAGS=-mod=mod go test ./...)
echo "== pytest"
if [ $# -eq 0 ]; then set -- -m "not (cluster and slow)"; fi
# Two workers (MC_TEST_WORKERS; 0 runs in this process): every case that reaches a CQL
# server goes to one of them (tests/conftest.py), the rest is spread over both.
workers=${MC_TEST_WORKERS:-2}
xdist=()
if [ "$workers" != 0 ]; then xdist=(-n "$workers" --dist loadgroup); fi
.venv/bin/python -m pytest -p no:cacheprovider --durations=25 "${xdist[@]}" "$@"
