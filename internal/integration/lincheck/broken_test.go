package lincheck

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/onceguard/onceguard/lock"
)

// bug is what a toyLock gets wrong.
type bug int

const (
	noBug        bug = iota
	grantAlways      // Acquire grants without checking whether the key is held
	releaseAny       // Release deletes whoever holds the key: no owner compare
	reuseFence       // every other grant repeats the last fence instead of raising it
	checkThenAct     // Acquire checks the holder and takes the key in two steps (GET, then SET)
)

func (b bug) String() string {
	return [...]string{"correct", "grants-without-checking", "release-without-owner-check", "fence-reused", "check-then-act"}[b]
}

// toyLock is a small in-memory lock.Backend with a switchable bug. Without
// one it is a correct lock, the control: the checker must pass it.
type toyLock struct {
	bug bug

	mu     sync.Mutex
	holder map[string]string
	fence  map[string]int64
	grants int
}

func newToy(b bug) *toyLock {
	return &toyLock{bug: b, holder: make(map[string]string), fence: make(map[string]int64)}
}

func (l *toyLock) Acquire(_ context.Context, r lock.Request) (lock.Grant, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bug == checkThenAct {
		// The race of a GET followed by a SET: another acquirer may take
		// the key between the two.
		free := l.holder[r.Key] == ""
		l.mu.Unlock()
		runtime.Gosched()
		l.mu.Lock()
		if !free {
			return lock.Grant{}, fmt.Errorf("toy: acquire %q: %w", r.Key, lock.ErrNotAcquired)
		}
	} else if l.holder[r.Key] != "" && l.bug != grantAlways {
		return lock.Grant{}, fmt.Errorf("toy: acquire %q: %w", r.Key, lock.ErrNotAcquired)
	}
	l.holder[r.Key] = r.Owner
	l.grants++
	if l.bug != reuseFence || l.grants%2 == 1 || l.fence[r.Key] == 0 {
		l.fence[r.Key] = max(l.fence[r.Key]+1, time.Now().UnixMicro())
	}
	return lock.Grant{Fence: l.fence[r.Key]}, nil
}

func (l *toyLock) Release(_ context.Context, key, owner string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.holder[key]
	switch {
	case h == "":
		return fmt.Errorf("toy: release %q: %w", key, lock.ErrExpired)
	case h != owner && l.bug != releaseAny:
		return fmt.Errorf("toy: release %q: %w", key, lock.ErrNotHeld)
	}
	delete(l.holder, key)
	return nil
}

func (l *toyLock) Refresh(context.Context, string, string, time.Duration) error { return nil }

// The checker catches broken locks: each bug, run under the same workload
// as the real backends, gives a history porcupine finds not linearizable;
// the same toy without the bug passes. A broken lock's visualization goes
// to the test's temporary directory (it is the expected outcome, not a
// failure).
func TestCheckerCatchesBrokenLock(t *testing.T) {
	for _, b := range []bug{noBug, grantAlways, releaseAny, reuseFence, checkThenAct} {
		t.Run(b.String(), func(t *testing.T) {
			rec := NewRecorder()
			l := lock.New(newToy(b), lockerOpts)
			// Tries only, so that TryOnly-strictness holds for the control;
			// rogue releases expose the missing owner compare.
			w := workload{clients: 8, cycles: 40, keys: 2, tryOnly: true, rogue: true, tolerant: b != noBug}
			st := w.run(t, rec, l)
			ops := rec.Ops()
			rep := Check(ops, Options{Model: Exclusive, StrictTry: true, Timeout: 20 * time.Second})
			ev := FindEvidence(ops)
			t.Logf("%v; %v\nevidence: %v", st, rep, ev)
			if b == noBug {
				if rep.Result != porcupine.Ok || !ev.Empty() {
					t.Fatalf("the correct toy lock: %v, evidence %v; want Ok and none", rep, ev)
				}
				return
			}
			if rep.Result != porcupine.Illegal {
				t.Fatalf("a lock with bug %q: %v; want porcupine.Illegal", b, rep)
			}
			visualize(t, rep, t.TempDir())
		})
	}
}
