package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// hist builds a JSONL history from compact lines:
//
//	"i <op> commit <cmid> <digest> <t>"          invoke a commit by alice
//	"i <op> read <t>"                             invoke a read
//	"ok <op> <seq> <mid> <t>"                     a commit's ACK
//	"err <op> <code> <t>"                         a definite error (the code's usual reason)
//	"unk <op> <t>"                                an unknown outcome
//	"read <op> <t> <cmid>:<seq>:<mid>:<digest> ..." a read's records
//	"create <member> ..."                         the conversation's creation
//
// A line may start with "@<conversation>" (default c1).
func hist(t *testing.T, lines ...string) string {
	t.Helper()
	var out []string
	conv := "c1"
	add := func(v map[string]interface{}) {
		v["tenant"], v["conversation"] = "t1", conv
		b, _ := json.Marshal(v)
		out = append(out, string(b))
	}
	reasons := map[string]string{"ALREADY_EXISTS": "IDEMPOTENCY_CONFLICT", "PERMISSION_DENIED": "NOT_A_MEMBER"}
	num := func(s string) int64 {
		var n int64
		for _, ch := range s {
			n = n*10 + int64(ch-'0')
		}
		return n
	}
	for _, l := range lines {
		f := strings.Fields(l)
		conv = "c1"
		if strings.HasPrefix(f[0], "@") {
			conv, f = f[0][1:], f[1:]
		}
		switch f[0] {
		case "create":
			add(map[string]interface{}{"type": "invoke", "op": 1000 + len(out), "kind": "create", "members": f[1:], "mono_ns": 1})
		case "i":
			if f[2] == "read" {
				add(map[string]interface{}{"type": "invoke", "op": num(f[1]), "kind": "read", "mono_ns": num(f[3])})
			} else {
				add(map[string]interface{}{"type": "invoke", "op": num(f[1]), "kind": "commit", "sender": "alice", "cmid": f[3], "digest": f[4], "mono_ns": num(f[5])})
			}
		case "ok":
			add(map[string]interface{}{"type": "complete", "op": num(f[1]), "outcome": "ok", "seq": num(f[2]), "message_id": f[3], "server_ts_ms": 7, "mono_ns": num(f[4])})
		case "err":
			add(map[string]interface{}{"type": "complete", "op": num(f[1]), "outcome": "error", "code": f[2], "reason": reasons[f[2]], "mono_ns": num(f[3])})
		case "unk":
			add(map[string]interface{}{"type": "complete", "op": num(f[1]), "outcome": "unknown", "mono_ns": num(f[2])})
		case "read":
			var records []map[string]interface{}
			for _, r := range f[3:] {
				p := strings.Split(r, ":")
				records = append(records, map[string]interface{}{"seq": num(p[1]), "message_id": p[2], "sender": "alice", "cmid": p[0], "digest": p[3], "server_ts_ms": 7})
			}
			add(map[string]interface{}{"type": "complete", "op": num(f[1]), "outcome": "ok", "records": records, "mono_ns": num(f[2])})
		}
	}
	path := filepath.Join(t.TempDir(), "h.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(out, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// table is the refusal classes toolkit/nemesis/outcomes.py passes.
var table = map[string]string{
	"ALREADY_EXISTS IDEMPOTENCY_CONFLICT": "conflict",
	"PERMISSION_DENIED NOT_A_MEMBER":      "not-member",
}

// verdict is Illegal when any conversation is, else Ok (or Unknown).
func verdict(t *testing.T, path string) porcupine.CheckResult {
	t.Helper()
	byConversation, err := Load(path, table)
	if err != nil {
		t.Fatal(err)
	}
	worst := porcupine.Ok
	for _, r := range Check(byConversation, 10*time.Second) {
		if r.Verdict == porcupine.Illegal {
			return r.Verdict
		}
		if r.Verdict != porcupine.Ok {
			worst = r.Verdict
		}
	}
	return worst
}

func TestGoodHistories(t *testing.T) {
	cases := map[string][]string{
		"sequential with a replay": {
			"i 1 commit a da 10", "ok 1 1 m1 20",
			"i 2 commit b db 30", "ok 2 2 m2 40",
			"i 3 commit a da 50", "ok 3 1 m1 60",
			"i 9 read 100", "read 9 110 a:1:m1:da b:2:m2:db",
		},
		"concurrent commits may take either order": {
			"i 1 commit a da 10", "i 2 commit b db 11", "ok 2 1 m2 30", "ok 1 2 m1 31",
			"i 9 read 100", "read 9 110 a:2:m1:da b:1:m2:db",
		},
		"gaps are allowed": {
			"i 1 commit a da 10", "ok 1 3 m1 20", "i 2 commit b db 30", "ok 2 7 m2 40",
			"i 9 read 100", "read 9 110 a:3:m1:da b:7:m2:db",
		},
		"a conflicting request is refused": {
			"i 1 commit a da 10", "ok 1 1 m1 20", "i 2 commit a dX 30", "err 2 ALREADY_EXISTS 40",
			"i 9 read 100", "read 9 110 a:1:m1:da",
		},
		"an unknown outcome that took effect": {
			"i 1 commit a da 10", "unk 1 20", "i 2 commit b db 30", "ok 2 2 m2 40",
			"i 9 read 100", "read 9 110 a:1:m1:da b:2:m2:db",
		},
		"an unknown outcome that did not take effect": {
			"i 1 commit a da 10", "unk 1 20", "i 2 commit b db 30", "ok 2 1 m2 40",
			"i 9 read 100", "read 9 110 b:1:m2:db",
		},
		"an unknown outcome finished by recovery after later commits": {
			"i 1 commit a da 10", "unk 1 20", "i 2 commit b db 30", "ok 2 1 m2 40",
			"i 9 read 100", "read 9 110 a:2:m1:da b:1:m2:db",
		},
		"a key reused in another conversation is refused": {
			"i 1 commit a da 10", "ok 1 1 m1 20", "@c2 i 2 commit a dB 30", "@c2 err 2 ALREADY_EXISTS 40",
			"i 9 read 100", "read 9 110 a:1:m1:da", "@c2 i 8 read 100", "@c2 read 8 110",
		},
		"a non-member is refused": {
			"create bob", "i 1 commit a da 10", "err 1 PERMISSION_DENIED 20", "i 9 read 100", "read 9 110",
		},
		"a read during the run is not an operation": {
			"i 1 commit a da 10", "ok 1 1 m1 20", "i 5 read 30", "read 5 40",
			"i 9 read 100", "read 9 110 a:1:m1:da",
		},
	}
	for name, lines := range cases {
		t.Run(name, func(t *testing.T) {
			if v := verdict(t, hist(t, lines...)); v != porcupine.Ok {
				t.Fatalf("want Ok, got %v", v)
			}
		})
	}
}

func TestBadHistories(t *testing.T) {
	cases := map[string][]string{
		"one seq given to two keys": {
			"i 1 commit a da 10", "ok 1 1 m1 20", "i 2 commit b db 30", "ok 2 1 m2 40",
			"i 9 read 100", "read 9 110 a:1:m1:da",
		},
		"a replay with another ACK": {
			"i 1 commit a da 10", "ok 1 1 m1 20", "i 2 commit a da 30", "ok 2 2 m9 40",
			"i 9 read 100", "read 9 110 a:1:m1:da",
		},
		"a conflicting request ACKed": {
			"i 1 commit a da 10", "ok 1 1 m1 20", "i 2 commit a dX 30", "ok 2 1 m1 40",
			"i 9 read 100", "read 9 110 a:1:m1:da",
		},
		"real-time order broken": {
			"i 1 commit a da 10", "ok 1 2 m1 20", "i 2 commit b db 30", "ok 2 1 m2 40",
			"i 9 read 100", "read 9 110 a:2:m1:da b:1:m2:db",
		},
		"an ACK missing from the final history": {
			"i 1 commit a da 10", "ok 1 1 m1 20", "i 9 read 100", "read 9 110",
		},
		"a record nobody sent": {
			"i 1 commit a da 10", "ok 1 1 m1 20", "i 9 read 100", "read 9 110 a:1:m1:da z:2:m7:dz",
		},
		"a conflict refused with a code no situation allows": {
			"i 1 commit a da 10", "ok 1 1 m1 20", "i 2 commit a dX 30", "err 2 FAILED_PRECONDITION 40",
			"i 9 read 100", "read 9 110 a:1:m1:da",
		},
		"a key held in another conversation ACKed": {
			"i 1 commit a da 10", "ok 1 1 m1 20", "@c2 i 2 commit a dB 30", "@c2 ok 2 1 m2 40",
			"i 9 read 100", "read 9 110 a:1:m1:da", "@c2 i 8 read 100", "@c2 read 8 110 a:1:m2:dB",
		},
		"a conflict refused before another conversation's request was sent": {
			"@c2 i 1 commit a dB 10", "@c2 err 1 ALREADY_EXISTS 20", "i 2 commit a da 30", "ok 2 1 m1 40",
			"i 9 read 100", "read 9 110 a:1:m1:da", "@c2 i 8 read 100", "@c2 read 8 110",
		},
		"a non-member ACKed": {
			"create bob", "i 1 commit a da 10", "ok 1 1 m1 20", "i 9 read 100", "read 9 110 a:1:m1:da",
		},
		"a member refused as a non-member": {
			"create alice", "i 1 commit a da 10", "err 1 PERMISSION_DENIED 20", "i 9 read 100", "read 9 110",
		},
		"a refused request took effect": {
			"i 1 commit a da 10", "err 1 ALREADY_EXISTS 20", "i 9 read 100", "read 9 110 a:1:m1:da",
		},
	}
	for name, lines := range cases {
		t.Run(name, func(t *testing.T) {
			if v := verdict(t, hist(t, lines...)); v != porcupine.Illegal {
				t.Fatalf("want Illegal, got %v", v)
			}
		})
	}
}
