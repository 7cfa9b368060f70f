// Command porcupine-check reads a nemesis history (JSONL, see toolkit/nemesis/history.py)
// and checks each conversation for linearizability with porcupine under the model of
// model.go.
//
//	porcupine-check -history H.jsonl -refusals JSON [-html failing.html] [-timeout 60s]
//
// Operations whose outcome is unknown (a timeout, an UNAVAILABLE after the last retry)
// are resolved from the conversation's final full-history read, as Jepsen does with
// :info operations: a key present there with this request's digest took effect, with
// that record's ACK, at some time after the call (its return time is infinite); a key
// absent there, or held by another request, never took effect and is dropped. The
// final read is itself an operation of the history.
//
// Keys are tenant-wide: a commit whose key another conversation's final read holds
// (for another request) may only be refused as a conflict. Only each conversation's
// final read is an operation: a read during the run is paged, not one snapshot
// (the project's checker checks those). A definite refusal is classed by the
// -refusals table ("CODE REASON": "conflict" | "not-member", from
// toolkit/nemesis/outcomes.py); any other is "refused", which the model never allows.
//
// Prints one line per non-linearizable conversation and, last, "anomalies: N".
// Exit code 0 when N is 0, 1 when it is not, 2 on a bad history.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Line is one line of the history file (every field any line may carry).
type Line struct {
	Type         string   `json:"type"`
	Op           int64    `json:"op"`
	Process      int      `json:"process"`
	Kind         string   `json:"kind"`
	Tenant       string   `json:"tenant"`
	Conversation string   `json:"conversation"`
	Sender       string   `json:"sender"`
	Cmid         string   `json:"cmid"`
	Digest       string   `json:"digest"`
	MonoNs       int64    `json:"mono_ns"`
	Outcome      string   `json:"outcome"`
	Code         string   `json:"code"`
	Reason       string   `json:"reason"`
	Members      []string `json:"members"`
	Seq          int64    `json:"seq"`
	MessageID    string   `json:"message_id"`
	ServerTsMs   int64    `json:"server_ts_ms"`
	Records      []Record `json:"records"`
}

// Record is one history record of a read.
type Record struct {
	Seq        int64  `json:"seq"`
	MessageID  string `json:"message_id"`
	Sender     string `json:"sender"`
	Cmid       string `json:"cmid"`
	Digest     string `json:"digest"`
	ServerTsMs int64  `json:"server_ts_ms"`
}

type pending struct {
	call     Line
	complete *Line
}

func key(sender, cmid string) string { return sender + "/" + cmid }

func conversationOf(l Line) string { return l.Tenant + "/" + l.Conversation }

// Load reads the history and returns each conversation's porcupine operations;
// refusals classes each definite refusal by "CODE REASON".
func Load(path string, refusals map[string]string) (map[string][]porcupine.Operation, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ops := map[int64]*pending{}
	order := []int64{}
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; scanner.Scan(); n++ {
		var l Line
		if err := json.Unmarshal(scanner.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("line %d: %v", n, err)
		}
		switch l.Type {
		case "invoke":
			ops[l.Op] = &pending{call: l}
			order = append(order, l.Op)
		case "complete":
			p, ok := ops[l.Op]
			if !ok {
				return nil, fmt.Errorf("line %d: completion of unknown op %d", n, l.Op)
			}
			done := l
			p.complete = &done
		}
	}
	if err := scanner.Err(); err != nil {
		return nil, err
	}
	return build(ops, order, refusals), nil
}

// facts are what one operation's input needs beyond its own lines.
type facts struct {
	members   map[string]map[string]bool // conversation -> member set (absent: all are)
	holders   map[string][]holder        // tenant key -> final-read holders
	firstCall map[string]int64           // tenant key + digest -> first commit invocation
	refusals  map[string]string
}

type holder struct {
	conversation string
	digest       string
}

func tenantKey(l Line) string { return l.Tenant + "/" + key(l.Sender, l.Cmid) }

func build(ops map[int64]*pending, order []int64, refusals map[string]string) map[string][]porcupine.Operation {
	// The final read of a conversation is its last read invoked (the one after heal
	// and recovery), when that one returned; a read during the run never stands in.
	final := map[string]*pending{}
	for _, id := range order {
		p := ops[id]
		if p.call.Kind == "read" {
			c := conversationOf(p.call)
			if prev, ok := final[c]; !ok || prev.call.MonoNs < p.call.MonoNs {
				final[c] = p
			}
		}
	}
	for c, p := range final {
		if p.complete == nil || p.complete.Outcome != "ok" {
			delete(final, c)
		}
	}
	f := facts{map[string]map[string]bool{}, map[string][]holder{}, map[string]int64{}, refusals}
	for _, id := range order {
		call := ops[id].call
		switch call.Kind {
		case "create":
			set := map[string]bool{}
			for _, m := range call.Members {
				set[m] = true
			}
			f.members[conversationOf(call)] = set
		case "commit":
			k := tenantKey(call) + "#" + call.Digest
			if first, ok := f.firstCall[k]; !ok || call.MonoNs < first {
				f.firstCall[k] = call.MonoNs
			}
		}
	}
	for c, read := range final {
		for _, r := range read.complete.Records {
			k := read.call.Tenant + "/" + key(r.Sender, r.Cmid)
			f.holders[k] = append(f.holders[k], holder{c, r.Digest})
		}
	}
	result := map[string][]porcupine.Operation{}
	for _, id := range order {
		p := ops[id]
		c := conversationOf(p.call)
		read, haveRead := final[c]
		if p.call.Kind == "read" && p != read {
			continue // a read during the run: paged, not one snapshot
		}
		var records map[string]Ack
		if haveRead {
			records = recordsOf(read.complete.Records)
		}
		op, keep := operation(p, records, haveRead, &f)
		if keep {
			result[c] = append(result[c], op)
		}
	}
	return result
}

func recordsOf(rs []Record) map[string]Ack {
	m := make(map[string]Ack, len(rs))
	for _, r := range rs {
		m[key(r.Sender, r.Cmid)] = Ack{Seq: r.Seq, MsgID: r.MessageID, ServerTS: r.ServerTsMs, Digest: r.Digest}
	}
	return m
}

// operation turns one invocation (and its completion) into a porcupine operation;
// keep is false for an operation that never took effect (or is not modelled).
func operation(p *pending, final map[string]Ack, haveRead bool, f *facts) (porcupine.Operation, bool) {
	call := p.call
	op := porcupine.Operation{ClientId: call.Process, Call: call.MonoNs, Return: math.MaxInt64}
	switch call.Kind {
	case "read":
		if p.complete == nil || p.complete.Outcome != "ok" {
			return op, false // a read that failed tells nothing
		}
		op.Input = Input{Kind: "read"}
		op.Output = Output{Outcome: "ok", Records: recordsOf(p.complete.Records)}
		op.Return = p.complete.MonoNs
		return op, true
	case "commit":
	default:
		return op, false // resume probes and the like are the project checker's
	}
	k := key(call.Sender, call.Cmid)
	done := p.complete
	op.Input = Input{Kind: "commit", Key: k, Digest: call.Digest, Member: f.member(call), Elsewhere: f.elsewhere(call, done)}
	if done != nil && done.Outcome == "ok" {
		op.Output = Output{Outcome: "ok", Ack: Ack{Seq: done.Seq, MsgID: done.MessageID, ServerTS: done.ServerTsMs, Digest: call.Digest}}
		op.Return = done.MonoNs
		return op, true
	}
	if done != nil && done.Outcome == "error" {
		op.Return = done.MonoNs
		class, known := f.refusals[done.Code+" "+done.Reason]
		if !known {
			class = "refused"
		}
		op.Output = Output{Outcome: class}
		return op, true
	}
	// Unknown outcome (or never completed): resolve from the final read.
	if !haveRead {
		return op, false
	}
	held, present := final[k]
	if !present || held.Digest != call.Digest {
		return op, false
	}
	op.Output = Output{Outcome: "ok", Ack: held}
	return op, true
}

func (f *facts) member(call Line) bool {
	set, known := f.members[conversationOf(call)]
	return !known || set[call.Sender]
}

// elsewhere says whether another conversation's final read holds the call's key
// for another request, and whether that request was sent before the call returned.
func (f *facts) elsewhere(call Line, done *Line) int {
	returned := int64(math.MaxInt64)
	if done != nil {
		returned = done.MonoNs
	}
	where := NotElsewhere
	tk := tenantKey(call)
	for _, h := range f.holders[tk] {
		if h.conversation == conversationOf(call) || h.digest == call.Digest {
			continue
		}
		where = ElsewhereLater
		if first, ok := f.firstCall[tk+"#"+h.digest]; ok && first < returned {
			return ElsewhereBefore
		}
	}
	return where
}

// Result of checking one conversation.
type Result struct {
	Conversation string
	Ops          int
	Verdict      porcupine.CheckResult
	Info         porcupine.LinearizationInfo
}

// Check checks every conversation; results sorted by conversation.
func Check(byConversation map[string][]porcupine.Operation, timeout time.Duration) []Result {
	names := make([]string, 0, len(byConversation))
	for c := range byConversation {
		names = append(names, c)
	}
	sort.Strings(names)
	results := make([]Result, 0, len(names))
	for _, c := range names {
		history := byConversation[c]
		verdict, info := porcupine.CheckOperationsVerbose(ConversationModel, history, timeout)
		results = append(results, Result{Conversation: c, Ops: len(history), Verdict: verdict, Info: info})
	}
	return results
}

func main() {
	historyPath := flag.String("history", "", "the JSONL history to check")
	refusalsJSON := flag.String("refusals", "", `definite refusals by "CODE REASON": "conflict" | "not-member" (JSON)`)
	htmlPath := flag.String("html", "", "write porcupine's visualisation of the first failing conversation here")
	timeout := flag.Duration("timeout", 120*time.Second, "search time limit per conversation (0: none)")
	flag.Parse()
	if *historyPath == "" {
		fmt.Fprintln(os.Stderr, "porcupine-check: -history is required")
		os.Exit(2)
	}
	refusals := map[string]string{}
	if err := json.Unmarshal([]byte(*refusalsJSON), &refusals); err != nil {
		fmt.Fprintf(os.Stderr, "porcupine-check: -refusals: %v\n", err)
		os.Exit(2)
	}
	byConversation, err := Load(*historyPath, refusals)
	if err != nil {
		fmt.Fprintf(os.Stderr, "porcupine-check: %v\n", err)
		os.Exit(2)
	}
	results := Check(byConversation, *timeout)
	anomalies, ops, visualised := 0, 0, false
	for _, r := range results {
		ops += r.Ops
		if r.Verdict == porcupine.Ok {
			continue
		}
		anomalies++
		what := "not linearizable"
		if r.Verdict == porcupine.Unknown {
			what = "not decided within the time limit (counted as an anomaly)"
		}
		fmt.Printf("conversation %s: %s (%d operations)\n", r.Conversation, what, r.Ops)
		if *htmlPath != "" && !visualised && r.Verdict == porcupine.Illegal {
			if err := porcupine.VisualizePath(ConversationModel, r.Info, *htmlPath); err == nil {
				fmt.Printf("visualisation: %s\n", *htmlPath)
				visualised = true
			}
		}
	}
	fmt.Printf("conversations: %d, operations: %d\n", len(results), ops)
	fmt.Printf("anomalies: %d\n", anomalies)
	if anomalies > 0 {
		os.Exit(1)
	}
}
