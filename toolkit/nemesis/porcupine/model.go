// The model of one conversation: idempotent, sequenced commits and a full-history read.
//
// State: the highest seq handed out and, per commit key, the ACK it was given
// (seq, message id, server time) with the identity digest of the request that
// took it. A commit of a new key must get a seq greater than every seq handed out
// so far; a repeat of a key must get the identical ACK for the identical request;
// a conflicting request (same key, other digest, or the key held in another
// conversation) is refused as a conflict and never ACKed; a non-member's send is
// refused as such and never ACKed; no other definite refusal is ever right (the
// classes come from toolkit/nemesis/outcomes.py). A read returns exactly the
// committed keys with their ACKs.
package main

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Ack is what one commit key was given, with the digest of the request that took it.
type Ack struct {
	Seq      int64
	MsgID    string
	ServerTS int64
	Digest   string
}

// Where else a key is held (from the other conversations' final reads; keys are
// tenant-wide).
const (
	NotElsewhere    = 0 // no other conversation holds the key
	ElsewhereBefore = 1 // another request holds it there, sent before this call returned
	ElsewhereLater  = 2 // another request holds it there, first sent after this call returned
)

// Input of an operation: a commit of Key (with the request's Digest), or a read.
type Input struct {
	Kind      string // "commit" or "read"
	Key       string
	Digest    string
	Member    bool // the sender is a member of the conversation
	Elsewhere int
}

// Output of an operation.
//
// Commit: Outcome "ok" (with Ack), "conflict" (refused: the key holds another
// request), "not-member" (refused: the sender is not a member) or "refused" (any
// other definite refusal, which is never right). Read: "ok" with Records, every key
// of the conversation and its ACK.
type Output struct {
	Outcome string
	Ack     Ack
	Records map[string]Ack
}

// State of one conversation; never mutated once built (Step copies).
type State struct {
	Last int64
	Keys map[string]Ack
}

func initState() interface{} { return State{Keys: map[string]Ack{}} }

func step(s interface{}, in interface{}, out interface{}) (bool, interface{}) {
	st, i, o := s.(State), in.(Input), out.(Output)
	switch i.Kind {
	case "read":
		return sameKeys(st.Keys, o.Records), st
	case "commit":
		held, exists := st.Keys[i.Key]
		other := (exists && held.Digest != i.Digest) || i.Elsewhere == ElsewhereBefore
		switch o.Outcome {
		case "ok":
			if !i.Member || i.Elsewhere != NotElsewhere {
				return false, st
			}
			if exists {
				return held == o.Ack && held.Digest == i.Digest, st
			}
			if o.Ack.Seq <= st.Last || o.Ack.Digest != i.Digest {
				return false, st
			}
			return true, st.with(i.Key, o.Ack)
		case "conflict":
			return other, st
		case "not-member":
			return !i.Member && !other, st
		}
	}
	return false, st
}

func (s State) with(key string, ack Ack) State {
	keys := make(map[string]Ack, len(s.Keys)+1)
	for k, v := range s.Keys {
		keys[k] = v
	}
	keys[key] = ack
	last := s.Last
	if ack.Seq > last {
		last = ack.Seq
	}
	return State{Last: last, Keys: keys}
}

func sameKeys(a, b map[string]Ack) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func equal(a, b interface{}) bool {
	x, y := a.(State), b.(State)
	return x.Last == y.Last && sameKeys(x.Keys, y.Keys)
}

func hash(s interface{}) uint64 {
	st := s.(State)
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d", st.Last, len(st.Keys))
	return h.Sum64()
}

func describeOperation(in interface{}, out interface{}) string {
	i, o := in.(Input), out.(Output)
	if i.Kind == "read" {
		return fmt.Sprintf("read() -> %d records", len(o.Records))
	}
	short := i.Digest
	if len(short) > 8 {
		short = short[:8]
	}
	if o.Outcome == "ok" {
		return fmt.Sprintf("commit(%s, %s) -> seq %d", i.Key, short, o.Ack.Seq)
	}
	return fmt.Sprintf("commit(%s, %s) -> %s", i.Key, short, o.Outcome)
}

func describeState(s interface{}) string {
	st := s.(State)
	keys := make([]string, 0, len(st.Keys))
	for k, v := range st.Keys {
		keys = append(keys, fmt.Sprintf("%s@%d", k, v.Seq))
	}
	sort.Strings(keys)
	return fmt.Sprintf("last=%d {%s}", st.Last, strings.Join(keys, ", "))
}

// ConversationModel is the porcupine model of one conversation's operations.
var ConversationModel = porcupine.Model{
	Init:              initState,
	Step:              step,
	Equal:             equal,
	Hash:              hash,
	DescribeOperation: describeOperation,
	DescribeState:     describeState,
}
