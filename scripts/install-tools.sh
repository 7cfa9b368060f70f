#!/usr/bin/env bash
# Installs the command-line tools the gRPC tests and the README use, into
# .tools/ (ignored by git), from the npm registry and the Go module proxy:
#   .tools/node_modules/.bin/buf       buf lint of protos/ (STANDARD rules)
#   .tools/bin/grpcurl                 calls the service through reflection
#   .tools/bin/grpc-health-probe       the Kubernetes-style health probe
#   .tools/bin/ghz                     a gRPC load generator (scripts/big-groups-public-tools.sh)
# Idempotent: a tool already there is left alone. Needs npm and go.
set -euo pipefail
cd "$(dirname "$0")/.."

BUF_VERSION=${BUF_VERSION:-1.75.0}
GRPCURL_VERSION=${GRPCURL_VERSION:-v1.9.4}
HEALTH_PROBE_VERSION=${HEALTH_PROBE_VERSION:-v0.4.63}
GHZ_VERSION=${GHZ_VERSION:-v0.93.0}

mkdir -p .tools/bin
# The folder ignores itself, so nothing installed here is ever committed.
[ -f .tools/.gitignore ] || printf '# Local tools; see scripts/install-tools.sh.\n*\n' > .tools/.gitignore

if [ ! -x .tools/node_modules/.bin/buf ]; then
  command -v npm >/dev/null 2>&1 || { echo "install-tools: npm is needed for buf" >&2; exit 1; }
  echo "install-tools: buf $BUF_VERSION"
  npm install --silent --no-audit --no-fund --prefix .tools "@bufbuild/buf@$BUF_VERSION" >/dev/null
fi

go_tool() {  # name, module path, version
  if [ ! -x ".tools/bin/$1" ]; then
    command -v go >/dev/null 2>&1 || { echo "install-tools: go is needed for $1" >&2; exit 1; }
    echo "install-tools: $1 $3"
    GOBIN="$PWD/.tools/bin" GOFLAGS=-mod=mod go install "$2@$3"
  fi
}
go_tool grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl "$GRPCURL_VERSION"
go_tool grpc-health-probe github.com/grpc-ecosystem/grpc-health-probe "$HEALTH_PROBE_VERSION"
go_tool ghz github.com/bojand/ghz/cmd/ghz "$GHZ_VERSION"

.tools/node_modules/.bin/buf --version >/dev/null
.tools/bin/grpcurl -version >/dev/null 2>&1
.tools/bin/grpc-health-probe -version >/dev/null 2>&1
.tools/bin/ghz --version >/dev/null 2>&1
