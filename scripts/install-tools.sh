#!/usr/bin/env bash
# Installs the command-line tools the gRPC tests and the README use, into
# .tools/ (ignored by git), from the npm registry and the Go module proxy:
#   .tools/node_modules/.bin/buf       buf lint of protos/ (STANDARD rules)
#   .tools/bin/grpcurl                 calls the service through reflection
#   .tools/bin/grpc-health-probe       the Kubernetes-style health probe
#   .tools/bin/toxiproxy-server        the TCP fault proxy of the nemesis (latency, resets)
#   .tools/bin/ghz                     a gRPC load generator (scripts/big-groups-public-tools.sh)
# Idempotent: a tool already there is left alone. Needs npm and go.
set -euo pipefail
cd "$(dirname "$0")/.."

BUF_VERSION=${BUF_VERSION:-1.75.0}
GRPCURL_VERSION=${GRPCURL_VERSION:-v1.9.4}
HEALTH_PROBE_VERSION=${HEALTH_PROBE_VERSION:-v0.4.63}
TOXIPROXY_VERSION=${TOXIPROXY_VERSION:-v2.5.0}
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
# Toxiproxy's command is named "server"; build it aside and give it its real name.
if [ ! -x .tools/bin/toxiproxy-server ]; then
  command -v go >/dev/null 2>&1 || { echo "install-tools: go is needed for toxiproxy" >&2; exit 1; }
  echo "install-tools: toxiproxy-server $TOXIPROXY_VERSION"
  gobin=$(mktemp -d)
  GOBIN="$gobin" GOFLAGS=-mod=mod go install "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION"
  mv "$gobin/server" .tools/bin/toxiproxy-server
  rm -rf "$gobin"
fi
# The porcupine checker of the nemesis (toolkit/nemesis/porcupine) is built on first use
# with `go build`; fetching its modules now keeps that step offline-safe.
if [ -f toolkit/nemesis/porcupine/go.mod ]; then
  (cd toolkit/nemesis/porcupine && GOFLAGS=-mod=mod go mod download)
fi
go_tool ghz github.com/bojand/ghz/cmd/ghz "$GHZ_VERSION"

.tools/node_modules/.bin/buf --version >/dev/null
.tools/bin/grpcurl -version >/dev/null 2>&1
.tools/bin/grpc-health-probe -version >/dev/null 2>&1
.tools/bin/toxiproxy-server -version >/dev/null 2>&1
.tools/bin/ghz --version >/dev/null 2>&1
