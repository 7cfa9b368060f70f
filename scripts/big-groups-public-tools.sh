#!/usr/bin/env bash
# Big conversations measured with public tools only: grpcurl (through server
# reflection) creates a small and a big conversation and adds the big one's
# members in pages of 10,000; ghz loads Commit on each; the ratio is printed.
#
#   scripts/big-groups-public-tools.sh [TARGET] [MEMBERS] [SECONDS]
#
# TARGET (default 127.0.0.1:50051) is a running `message-committer serve`
# started with MC_SENDER_RATE_PER_S=0 (ghz sends as one member). MEMBERS
# (default 100000) is the big conversation's size; SECONDS (default 10) each
# ghz run's duration, with 32 concurrent streams.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${1:-127.0.0.1:50051}
MEMBERS=${2:-100000}
SECONDS_PER_RUN=${3:-10}
GRPCURL=${GRPCURL:-.tools/bin/grpcurl}
GHZ=${GHZ:-.tools/bin/ghz}
TENANT="pub-$(date +%s)"
PAGE=10000

members_json() {  # first count: a JSON list of user ids b.u<first> .. b.u<first+count-1>
  python3 -c "import json,sys; a,n=int(sys.argv[1]),int(sys.argv[2]); print(json.dumps(['b.u%d' % i for i in range(a, a+n)]))" "$1" "$2"
}

call() {  # method, json body on stdin
  "$GRPCURL" -plaintext -d @ "$TARGET" "message_committer.v1.ConversationMembershipService/$1" >/dev/null
}

echo "creating conversations in tenant $TENANT ($MEMBERS members in the big one)"
echo "{\"tenant\":\"$TENANT\",\"conversation\":\"small\",\"members\":[\"b.u0\",\"b.u1\",\"b.u2\",\"b.u3\"]}" | call CreateConversation
first=$(( MEMBERS < PAGE ? MEMBERS : PAGE ))
echo "{\"tenant\":\"$TENANT\",\"conversation\":\"big\",\"members\":$(members_json 0 "$first")}" | call CreateConversation
added=$first
started=$(date +%s.%N)
while [ "$added" -lt "$MEMBERS" ]; do
  count=$(( MEMBERS - added < PAGE ? MEMBERS - added : PAGE ))
  echo "{\"tenant\":\"$TENANT\",\"conversation\":\"big\",\"members\":$(members_json "$added" "$count")}" | call AddMembers
  added=$(( added + count ))
done
echo "added $added members in $(python3 -c "import sys; print(round($(date +%s.%N) - $started, 1))") s"
"$GRPCURL" -plaintext -d "{\"tenant\":\"$TENANT\",\"conversation\":\"big\",\"page_size\":1}" "$TARGET" \
  message_committer.v1.ConversationMembershipService/ListMembers | grep -E '"version"'

load() {  # conversation -> commits/s
  "$GHZ" --insecure --proto protos/message_committer/v1/committer.proto --import-paths protos \
    --call message_committer.v1.MessageCommitterService.Commit \
    --concurrency 32 --duration "${SECONDS_PER_RUN}s" --connections 4 --format json \
    -d "{\"send\":{\"tenant\":\"$TENANT\",\"sender\":\"b.u1\",\"device\":\"d\",\"conversation\":\"$1\",\"client_message_id\":\"$1-{{.RequestNumber}}-{{.WorkerID}}\",\"content\":{\"message_type\":\"MESSAGE_TYPE_TEXT\",\"inline_body\":\"$(printf 'x%.0s' $(seq 1 100) | base64 -w0)\"}}}" \
    "$TARGET" | python3 -c '
import json, sys
r = json.load(sys.stdin)
codes = r.get("statusCodeDistribution", {})
lat = {d["percentage"]: d["latency"] / 1e6 for d in r.get("latencyDistribution") or []}
print("%.1f %s %s %s" % (r["rps"], json.dumps(codes, separators=(",", ":")), lat.get(50), lat.get(99)))'
}

read -r small_rps small_codes small_p50 small_p99 <<<"$(load small)"
read -r big_rps big_codes big_p50 big_p99 <<<"$(load big)"
echo "small (4 members):         ${small_rps} commits/s  p50 ${small_p50} ms  p99 ${small_p99} ms  codes ${small_codes}"
echo "big (${MEMBERS} members):  ${big_rps} commits/s  p50 ${big_p50} ms  p99 ${big_p99} ms  codes ${big_codes}"
python3 -c "print('big/small: %.3f' % ($big_rps / $small_rps))"
