package lincheck

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// h builds a history from ops with explicit times.
func acq(c int, owner string, fence, call, ret int64) Op {
	return Op{Client: c, Key: "k", Kind: Acquire, Owner: owner, Fence: fence, Call: call, Return: ret}
}

func rel(c int, owner string, call, ret int64) Op {
	return Op{Client: c, Key: "k", Kind: Release, Owner: owner, Call: call, Return: ret}
}

func wr(c int, owner string, v, call, ret int64) Op {
	return Op{Client: c, Key: "k", Kind: Write, Owner: owner, Fence: v, Call: call, Return: ret}
}

func rd(c int, owner string, v, call, ret int64) Op {
	return Op{Client: c, Key: "k", Kind: Read, Owner: owner, Value: v, Call: call, Return: ret}
}

func with(op Op, f func(*Op)) Op { f(&op); return op }

// The models on small hand-written histories: what they accept and what
// they refuse, one rule at a time.
func TestModelRules(t *testing.T) {
	cases := []struct {
		name   string
		opts   Options
		ops    []Op
		legal  bool
		reason string
	}{
		{"sequential holders", Options{}, []Op{
			acq(0, "a", 10, 0, 1), wr(0, "a", 10, 2, 3), rd(0, "a", 10, 4, 5), rel(0, "a", 6, 7),
			acq(1, "b", 11, 8, 9), wr(1, "b", 11, 10, 11), rd(1, "b", 11, 12, 13), rel(1, "b", 14, 15),
		}, true, ""},
		{"concurrent acquires ordered by the checker", Options{}, []Op{
			acq(0, "a", 10, 0, 10), acq(1, "b", 11, 1, 30), rel(0, "a", 11, 12), rel(1, "b", 31, 32),
		}, true, ""},
		{"second grant while held", Options{}, []Op{
			acq(0, "a", 10, 0, 1), acq(1, "b", 11, 2, 3), rel(0, "a", 4, 5), rel(1, "b", 6, 7),
		}, false, "b was granted after a returned and before a released"},
		{"fence not increasing", Options{}, []Op{
			acq(0, "a", 10, 0, 1), rel(0, "a", 2, 3), acq(1, "b", 10, 4, 5), rel(1, "b", 6, 7),
		}, false, "equal fences"},
		{"fence order follows lock order, not call order", Options{}, []Op{
			// b called first but granted second: its fence must be larger.
			acq(1, "b", 9, 0, 20), acq(0, "a", 10, 1, 2), rel(0, "a", 3, 4), rel(1, "b", 21, 22),
		}, false, "b, granted after a released, has the smaller fence"},
		{"read sees a foreign write", Options{}, []Op{
			acq(0, "a", 10, 0, 1), wr(0, "a", 10, 2, 3), rd(0, "a", 11, 4, 5), rel(0, "a", 6, 7),
		}, false, "nobody else may write inside a's critical section"},
		{"write by a non-holder", Options{}, []Op{
			acq(0, "a", 10, 0, 1), wr(1, "b", 11, 2, 3), rel(0, "a", 4, 5),
		}, false, "b never held the lock"},
		{"release by a non-owner that succeeds", Options{}, []Op{
			acq(0, "a", 10, 0, 1), with(rel(1, "rogue", 2, 3), func(o *Op) { o.Rogue = true }), rel(0, "a", 4, 5),
		}, false, "the release must compare the owner"},
		{"release by a non-owner refused", Options{}, []Op{
			acq(0, "a", 10, 0, 1), with(rel(1, "rogue", 2, 3), func(o *Op) { o.Rogue, o.Result = true, NotHeld }), rel(0, "a", 4, 5),
		}, true, ""},
		{"own release refused while held", Options{}, []Op{
			acq(0, "a", 10, 0, 1), with(rel(0, "a", 2, 3), func(o *Op) { o.Result = NotHeld }),
		}, false, "nobody else could have taken it"},
		{"refused try on a free lock", Options{StrictTry: true}, []Op{
			acq(0, "a", 10, 0, 1), rel(0, "a", 2, 3), with(acq(1, "", 0, 4, 5), func(o *Op) { o.Result = NotAcquired }),
		}, false, "StrictTry: nobody held it"},
		{"refused try on a free lock, not strict", Options{}, []Op{
			acq(0, "a", 10, 0, 1), rel(0, "a", 2, 3), with(acq(1, "", 0, 4, 5), func(o *Op) { o.Result = NotAcquired }),
		}, true, ""},
		{"refused try overlapping a hold", Options{StrictTry: true}, []Op{
			acq(0, "a", 10, 0, 1), with(acq(1, "", 0, 2, 6), func(o *Op) { o.Result = NotAcquired }), rel(0, "a", 3, 4),
		}, true, ""},
		{"unknown acquire that took the lock", Options{}, []Op{
			with(acq(0, "a", 0, 0, 1), func(o *Op) { o.Result = Unknown }),
			with(acq(1, "", 0, 2, 3), func(o *Op) { o.Result = NotAcquired }),
			with(rel(0, "a", 4, 5), func(o *Op) { o.Result = OK }),
			acq(1, "b", 11, 6, 7),
		}, true, ""},
		{"unknown acquire that did not", Options{}, []Op{
			with(acq(0, "a", 0, 0, 1), func(o *Op) { o.Result = Unknown }),
			acq(1, "b", 11, 2, 3), rel(1, "b", 4, 5),
		}, true, ""},
		{"unknown release either way", Options{}, []Op{
			acq(0, "a", 10, 0, 1), with(rel(0, "a", 2, 3), func(o *Op) { o.Result = Unknown }),
			acq(1, "b", 11, 4, 5),
		}, true, ""},
		{"fenced: fences backwards in real time", Options{Model: Fenced}, []Op{
			acq(0, "a", 11, 0, 1), acq(1, "b", 10, 2, 3),
		}, false, "b called after a returned"},
		{"fenced: overlapping holders are allowed", Options{Model: Fenced}, []Op{
			acq(0, "a", 10, 0, 1), acq(1, "b", 11, 2, 3), wr(0, "a", 10, 4, 5), wr(1, "b", 11, 6, 7), rd(0, "a", 11, 8, 9),
		}, true, ""},
		{"fenced: stale write accepted", Options{Model: Fenced}, []Op{
			acq(0, "a", 10, 0, 1), acq(1, "b", 11, 2, 3),
			{Client: 1, Key: "k", Kind: FencedWrite, Owner: "b", Fence: 11, Call: 4, Return: 5},
			{Client: 0, Key: "k", Kind: FencedWrite, Owner: "a", Fence: 10, Call: 6, Return: 7},
		}, false, "a's write after b's must be refused"},
		{"fenced: stale write refused", Options{Model: Fenced}, []Op{
			acq(0, "a", 10, 0, 1), acq(1, "b", 11, 2, 3),
			{Client: 1, Key: "k", Kind: FencedWrite, Owner: "b", Fence: 11, Call: 4, Return: 5},
			{Client: 0, Key: "k", Kind: FencedWrite, Owner: "a", Fence: 10, Result: Refused, Call: 6, Return: 7},
		}, true, ""},
		{"fenced: spurious refusal", Options{Model: Fenced}, []Op{
			acq(0, "a", 10, 0, 1),
			{Client: 0, Key: "k", Kind: FencedWrite, Owner: "a", Fence: 10, Result: Refused, Call: 2, Return: 3},
		}, false, "nothing newer was accepted"},
		{"partitions are independent", Options{}, []Op{
			acq(0, "a", 10, 0, 1), with(acq(1, "b", 5, 2, 3), func(o *Op) { o.Key = "other" }),
		}, true, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := Check(c.ops, c.opts)
			if got := rep.Result == porcupine.Ok; got != c.legal {
				t.Errorf("%v; want legal=%v (%s)\n%s", rep, c.legal, c.reason, FindEvidence(c.ops))
			}
		})
	}
}

// Dropping legal no-ops must not hide anything: a refused release by an
// owner that was granted the lock is kept.
func TestTrivialOpsDropped(t *testing.T) {
	ops := []Op{
		acq(0, "a", 10, 0, 1),
		with(acq(1, "", 0, 2, 3), func(o *Op) { o.Result = NotAcquired }),
		with(rel(2, "rogue", 4, 5), func(o *Op) { o.Rogue, o.Result = true, Expired }),
		rel(0, "a", 6, 7),
	}
	if rep := Check(ops, Options{}); rep.Result != porcupine.Ok || rep.Checked != 2 || rep.Ops != 4 {
		t.Errorf("%v; want Ok with 2 of 4 ops checked", rep)
	}
	if rep := Check(ops, Options{StrictTry: true}); rep.Checked != 3 {
		t.Errorf("StrictTry: %v; want the refused try checked (3 ops)", rep)
	}
}

func TestEvidence(t *testing.T) {
	ops := []Op{
		acq(0, "a", 10, 0, 1), wr(0, "a", 10, 2, 3),
		acq(1, "b", 9, 4, 5), wr(1, "b", 9, 6, 7),
		rd(0, "a", 9, 8, 9), rel(0, "a", 10, 11), rel(1, "b", 12, 13),
	}
	e := FindEvidence(ops)
	if e.NForeign != 1 || e.NOverlaps != 1 || e.NInversions != 1 {
		t.Errorf("evidence = %v; want 1 foreign read, 1 overlap, 1 inversion", e)
	}
	if e := FindEvidence(ops[:2]); !e.Empty() {
		t.Errorf("evidence of a clean history = %v; want none", e)
	}
}
