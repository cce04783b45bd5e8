package lincheck

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Model names a sequential specification (see the package documentation).
type Model int

// Models.
const (
	// Exclusive is the lock: at most one holder, fences increasing in
	// lock order, critical-section operations only by the holder, reads
	// seeing the holder's own write.
	Exclusive Model = iota + 1
	// Fenced asserts no exclusion: fences increase in real-time order, and
	// the fenced register never accepts a stale write.
	Fenced
)

func (m Model) String() string {
	switch m {
	case Exclusive:
		return "exclusive"
	case Fenced:
		return "fenced"
	}
	return fmt.Sprintf("Model(%d)", int(m))
}

// Options configure Check.
type Options struct {
	Model Model // default Exclusive
	// StrictTry (Exclusive only): a refused acquire must linearize while
	// the lock is held. See the package documentation for when it is
	// valid.
	StrictTry bool
	// Timeout bounds porcupine's search; default 30s. A search that runs
	// out gives porcupine.Unknown.
	Timeout time.Duration
}

// Report is the outcome of Check.
type Report struct {
	Result     porcupine.CheckResult
	Model      Model
	Ops        int           // operations in the history
	Checked    int           // operations left after dropping legal no-ops
	Partitions int           // (scope, key) partitions searched
	Duration   time.Duration // the search (the first, not the verbose rerun)

	model   porcupine.Model
	info    porcupine.LinearizationInfo
	hasInfo bool
}

func (r Report) String() string {
	return fmt.Sprintf("%s model: %d ops (%d checked) in %d partitions: %s in %v",
		r.Model, r.Ops, r.Checked, r.Partitions, r.Result, r.Duration.Round(time.Microsecond))
}

// Visualize writes porcupine's HTML visualization of a failed check to
// path. It is available when Result is not Ok.
func (r Report) Visualize(path string) error {
	if !r.hasInfo {
		return fmt.Errorf("lincheck: no linearization info (result %s)", r.Result)
	}
	return porcupine.VisualizePath(r.model, r.info, path)
}

// state is one state of the sequential specification. It is comparable.
type state struct {
	holder string // owner holding the lock, "" when free (exclusive model)
	fence  int64  // highest fence granted: a lower bound after Unknown acquires
	reg    int64  // the plain register (exclusive model)
	fenced int64  // the fenced register's highest accepted fence
}

// ghost holds the lock after an acquire of unknown owner and outcome: no
// later operation names it, so it is never released.
const ghost = "?ghost"

func (s state) String() string {
	h := "free"
	if s.holder != "" {
		h = "held by " + short(s.holder)
	}
	return fmt.Sprintf("%s, fence %d, reg %d, fenced %d", h, s.fence, s.reg, s.fenced)
}

// stepExclusive is the exclusive model's transition relation: the states
// op can lead to from s (none: illegal).
func stepExclusive(s state, op Op, strict bool) []any {
	switch op.Kind {
	case Acquire:
		switch op.Result {
		case OK:
			if s.holder == "" && op.Fence > s.fence {
				s.holder, s.fence = op.Owner, op.Fence
				return []any{s}
			}
		case NotAcquired:
			if !strict || s.holder != "" {
				return []any{s}
			}
		default: // Unknown: may have taken the lock, with an unseen fence
			next := []any{s}
			if s.holder == "" {
				g := s
				g.holder = op.Owner
				if g.holder == "" {
					g.holder = ghost
				}
				next = append(next, g)
			}
			return next
		}
	case Release:
		switch op.Result {
		case OK:
			if s.holder == op.Owner {
				s.holder = ""
				return []any{s}
			}
		case NotHeld, Expired:
			if s.holder != op.Owner {
				return []any{s}
			}
		default:
			next := []any{s}
			if s.holder == op.Owner {
				f := s
				f.holder = ""
				next = append(next, f)
			}
			return next
		}
	case Write:
		if s.holder == op.Owner {
			s.reg = op.Fence
			return []any{s}
		}
	case Read:
		if s.holder == op.Owner && s.reg == op.Value {
			return []any{s}
		}
	case FencedWrite:
		if s.holder != op.Owner {
			return nil
		}
		if op.Result == OK && op.Fence >= s.fenced {
			s.fenced = op.Fence
			return []any{s}
		}
		if op.Result == Refused && op.Fence < s.fenced {
			return []any{s}
		}
	}
	return nil
}

// stepFenced is the fenced model's transition relation.
func stepFenced(s state, op Op) []any {
	switch {
	case op.Kind == Acquire && op.Result == OK:
		if op.Fence > s.fence {
			s.fence = op.Fence
			return []any{s}
		}
		return nil
	case op.Kind == FencedWrite && op.Result == OK:
		if op.Fence >= s.fenced {
			s.fenced = op.Fence
			return []any{s}
		}
		return nil
	case op.Kind == FencedWrite:
		if op.Fence < s.fenced {
			return []any{s}
		}
		return nil
	}
	return []any{s}
}

// trivial reports whether op is legal and changes nothing in every state
// of the model, so that dropping it changes no verdict. granted: an
// acquire in op's partition may have granted the lock to op.Owner.
func trivial(op Op, opts Options, granted bool) bool {
	if opts.Model == Fenced {
		return !(op.Kind == Acquire && op.Result == OK) && op.Kind != FencedWrite
	}
	switch {
	case op.Kind == Acquire && op.Result == NotAcquired:
		return !opts.StrictTry
	case op.Kind == Release && (op.Result == NotHeld || op.Result == Expired):
		return !granted
	}
	return false
}

func partKey(op Op) string { return op.Scope + "\x00" + op.Key }

// Check checks ops against the model of opts, each (Scope, Key) partition
// on its own. When the result is not Ok it reruns the search verbosely so
// that Report.Visualize can draw it.
func Check(ops []Op, opts Options) Report {
	if opts.Model == 0 {
		opts.Model = Exclusive
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	granted := make(map[string]bool)
	for _, op := range ops {
		if op.Kind == Acquire && (op.Result == OK || op.Result == Unknown) && op.Owner != "" {
			granted[partKey(op)+"\x00"+op.Owner] = true
		}
	}
	var history []porcupine.Operation
	parts := make(map[string]bool)
	for _, op := range ops {
		if trivial(op, opts, granted[partKey(op)+"\x00"+op.Owner]) {
			continue
		}
		parts[partKey(op)] = true
		history = append(history, porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Return: op.Return})
	}
	model := porcupineModel(opts)
	rep := Report{Model: opts.Model, Ops: len(ops), Checked: len(history), Partitions: len(parts), model: model}
	start := time.Now()
	rep.Result = porcupine.CheckOperationsTimeout(model, history, opts.Timeout)
	rep.Duration = time.Since(start)
	if rep.Result != porcupine.Ok {
		_, rep.info = porcupine.CheckOperationsVerbose(model, history, opts.Timeout)
		rep.hasInfo = true
	}
	return rep
}

func porcupineModel(opts Options) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byKey := make(map[string][]porcupine.Operation)
			var order []string
			for _, o := range history {
				k := partKey(o.Input.(Op))
				if _, ok := byKey[k]; !ok {
					order = append(order, k)
				}
				byKey[k] = append(byKey[k], o)
			}
			out := make([][]porcupine.Operation, 0, len(order))
			for _, k := range order {
				out = append(out, byKey[k])
			}
			return out
		},
		Init: func() []any { return []any{state{}} },
		Step: func(s, input, _ any) []any {
			if opts.Model == Fenced {
				return stepFenced(s.(state), input.(Op))
			}
			return stepExclusive(s.(state), input.(Op), opts.StrictTry)
		},
		Equal: func(a, b any) bool { return a.(state) == b.(state) },
		Hash: func(s any) uint64 {
			st := s.(state)
			h := fnv.New64a()
			fmt.Fprintf(h, "%s|%d|%d|%d", st.holder, st.fence, st.reg, st.fenced)
			return h.Sum64()
		},
		DescribeOperation: func(input, _ any) string {
			op := input.(Op)
			s := op.String()
			if i := strings.LastIndex(s, " @"); i > 0 {
				s = s[:i]
			}
			return s
		},
		DescribeState: func(s any) string { return s.(state).String() },
	}
	return nm.ToModel()
}

// Evidence is what a history shows without any search: direct witnesses
// of a broken lock, for failure messages and for counting the overlaps a
// fallback allows by design. Each list is capped; the counts are not.
type Evidence struct {
	// ForeignReads: a holder read a value other than its own fence back
	// from the plain register: someone wrote inside its critical section.
	ForeignReads []string
	NForeign     int
	// Overlaps: two leases on one key whose holds certainly overlapped:
	// each was granted (its acquire had returned) before the other's
	// release was called.
	Overlaps  []string
	NOverlaps int
	// Inversions: an acquire returned before another was called, yet its
	// fence is not smaller.
	Inversions  []string
	NInversions int
	// StaleAccepts: the fenced register accepted a write of lease L after
	// it had accepted one of a lease L' whose acquire was called after L's
	// returned.
	StaleAccepts  []string
	NStaleAccepts int
}

const evidenceCap = 5

// Empty reports whether nothing was found.
func (e Evidence) Empty() bool {
	return e.NForeign+e.NOverlaps+e.NInversions+e.NStaleAccepts == 0
}

func (e Evidence) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d foreign reads, %d certain overlaps, %d fence inversions, %d stale writes accepted",
		e.NForeign, e.NOverlaps, e.NInversions, e.NStaleAccepts)
	for _, l := range [][]string{e.ForeignReads, e.Overlaps, e.Inversions, e.StaleAccepts} {
		for _, s := range l {
			b.WriteString("\n  " + s)
		}
	}
	return b.String()
}

func add(list *[]string, n *int, s string) {
	*n++
	if len(*list) < evidenceCap {
		*list = append(*list, s)
	}
}

type lease struct {
	acq     Op
	relCall int64 // when its first release was called; max int64 if never
}

// FindEvidence looks for direct witnesses in ops, per (Scope, Key).
func FindEvidence(ops []Op) Evidence {
	var e Evidence
	leases := make(map[string]*lease) // partKey + owner
	var order []string
	for _, op := range ops {
		if op.Kind == Acquire && op.Result == OK {
			k := partKey(op) + "\x00" + op.Owner
			leases[k] = &lease{acq: op, relCall: 1<<63 - 1}
			order = append(order, k)
		}
	}
	for _, op := range ops {
		if op.Kind == Release && !op.Rogue {
			if l := leases[partKey(op)+"\x00"+op.Owner]; l != nil && op.Call < l.relCall {
				l.relCall = op.Call
			}
		}
	}
	for _, op := range ops {
		if op.Kind == Read {
			if l := leases[partKey(op)+"\x00"+op.Owner]; l != nil && op.Value != l.acq.Fence {
				add(&e.ForeignReads, &e.NForeign, fmt.Sprintf("holder of fence %d read %d: %v", l.acq.Fence, op.Value, op))
			}
		}
	}
	byPart := make(map[string][]*lease)
	var parts []string
	for _, k := range order {
		l := leases[k]
		p := partKey(l.acq)
		if _, ok := byPart[p]; !ok {
			parts = append(parts, p)
		}
		byPart[p] = append(byPart[p], l)
	}
	for _, p := range parts {
		ls := byPart[p]
		slices.SortFunc(ls, func(a, b *lease) int { return cmpInt(a.acq.Return, b.acq.Return) })
		for i, a := range ls {
			for _, b := range ls[i+1:] {
				// b was granted after a (by return time).
				if b.acq.Return < a.relCall && a.acq.Return < b.relCall {
					add(&e.Overlaps, &e.NOverlaps, fmt.Sprintf("fence %d held [%.3fms, %.3fms] and fence %d held [%.3fms, %.3fms] on %q",
						a.acq.Fence, ms(a.acq.Return), ms(a.relCall), b.acq.Fence, ms(b.acq.Return), ms(b.relCall), a.acq.Key))
				}
				if a.acq.Return < b.acq.Call && a.acq.Fence >= b.acq.Fence {
					add(&e.Inversions, &e.NInversions, fmt.Sprintf("%v, then %v", a.acq, b.acq))
				}
			}
		}
	}
	// Stale accepts, per partition: accepted writes in return order.
	type write struct {
		op  Op
		acq Op
	}
	accepted := make(map[string][]write)
	for _, op := range ops {
		if op.Kind == FencedWrite && op.Result == OK {
			if l := leases[partKey(op)+"\x00"+op.Owner]; l != nil {
				accepted[partKey(op)] = append(accepted[partKey(op)], write{op, l.acq})
			}
		}
	}
	for _, p := range parts {
		ws := accepted[p]
		for _, w := range ws {
			for _, newer := range ws {
				if newer.op.Return < w.op.Call && w.acq.Return < newer.acq.Call {
					add(&e.StaleAccepts, &e.NStaleAccepts, fmt.Sprintf("accepted %v after %v", w.op, newer.op))
				}
			}
		}
	}
	return e
}

func ms(ns int64) float64 {
	if ns == 1<<63-1 {
		return -1
	}
	return float64(ns) / 1e6
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
