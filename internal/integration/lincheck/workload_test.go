package lincheck

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/onceguard/onceguard/internal/leakcheck"
	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{}) // the fallback test kills a server on purpose
	leakcheck.VerifyTestMain(m,
		leakcheck.IgnoreTopFunction(redistest.SpawnerFunction),
		// go-redis probes a dead server from a goroutine that sleeps 1s
		// between tries and notices a closed client only after that.
		leakcheck.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
		// database/sql's opener exits asynchronously after Close.
		leakcheck.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		leakcheck.IgnoreAnyFunction("database/sql.(*DB).connectionOpener"))
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// ttl is every lease's TTL: far longer than any run, so that no lease
// expires (the models do not model expiry).
const ttl = 60 * time.Second

// lockerOpts makes blocking Acquires on polling backends retry often, so
// that waiters contend instead of sleeping.
var lockerOpts = &lock.Options{MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond}

// workload is what the clients of a run do.
type workload struct {
	clients int
	cycles  int           // per client; 0: until stop is closed
	stop    chan struct{} // with cycles 0
	keys    int
	// tryOnly: only TryAcquire; otherwise half the attempts are blocking
	// Acquires.
	tryOnly bool
	// rogue: one cycle in eight starts with a release by a random owner.
	rogue bool
	// tolerant: release and acquire errors are recorded, not reported
	// (broken locks, faults).
	tolerant bool
	// ks, if set, are the keys (and registers) to use instead of keys new
	// ones.
	ks *keyset
}

// keyset is a run's lock keys, unique to the run, with each key's plain
// Register and FencedRegister.
type keyset struct {
	keys   []string
	regs   map[string]*Register
	fenced map[string]*FencedRegister
}

func newKeyset(t *testing.T, n int) *keyset {
	ks := &keyset{regs: make(map[string]*Register), fenced: make(map[string]*FencedRegister)}
	for i := range n {
		k := fmt.Sprintf("lincheck/%s/%d/k%d", t.Name(), time.Now().UnixNano(), i)
		ks.keys = append(ks.keys, k)
		ks.regs[k], ks.fenced[k] = &Register{}, &FencedRegister{}
	}
	return ks
}

// stats counts what a run did.
type stats struct {
	granted, refused, rogue, errs, staleRefused atomic.Int64
}

func (s *stats) String() string {
	return fmt.Sprintf("%d leases, %d refused tries, %d rogue releases, %d errors, %d second fenced writes refused",
		s.granted.Load(), s.refused.Load(), s.rogue.Load(), s.errs.Load(), s.staleRefused.Load())
}

// run drives the workload through l, recording into rec. Every holder
// writes its fence into the key's Register and its FencedRegister, pauses
// (nothing, a yield, up to 200µs, or one time in sixteen 1 to 3ms), writes
// its fence into the FencedRegister again (the end of its work: refused if
// a newer holder wrote meanwhile), reads the Register back and releases.
// Unexpected errors are reported with t.Errorf unless tolerant.
func (w workload) run(t *testing.T, rec *Recorder, l *lock.Locker) *stats {
	t.Helper()
	ks := w.ks
	if ks == nil {
		ks = newKeyset(t, w.keys)
	}
	keys, regs, fenced := ks.keys, ks.regs, ks.fenced
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st := &stats{}
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var errs []string
	fail := func(format string, args ...any) {
		st.errs.Add(1)
		if w.tolerant {
			return
		}
		errMu.Lock()
		defer errMu.Unlock()
		if len(errs) < 10 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
	}
	for c := range w.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := WithClient(ctx, c)
			rnd := rand.New(rand.NewPCG(uint64(c), uint64(time.Now().UnixNano())))
			for i := 0; w.cycles == 0 || i < w.cycles; i++ {
				if w.cycles == 0 {
					select {
					case <-w.stop:
						return
					default:
					}
				}
				key := keys[rnd.IntN(len(keys))]
				if w.rogue && rnd.IntN(8) == 0 {
					st.rogue.Add(1)
					if err := rec.RogueRelease(ctx, c, l.Backend(), key); err == nil {
						fail("rogue release of %q = nil; want ErrNotHeld or ErrExpired", key)
					}
				}
				var (
					lease *lock.Lease
					err   error
				)
				if w.tryOnly || rnd.IntN(2) == 0 {
					lease, err = rec.TryAcquire(ctx, c, l, key, ttl)
					if errors.Is(err, lock.ErrNotAcquired) && Classify(err) == NotAcquired {
						st.refused.Add(1)
						time.Sleep(time.Duration(rnd.IntN(100)) * time.Microsecond)
						continue
					}
				} else {
					lease, err = rec.Acquire(ctx, c, l, key, ttl)
				}
				if err != nil {
					fail("acquire %q: %v", key, err)
					continue
				}
				st.granted.Add(1)
				rec.Write(c, regs[key], lease)
				rec.FencedWrite(c, fenced[key], lease)
				switch n := rnd.IntN(16); {
				case n == 0: // a long hold, as slow work under the lock
					time.Sleep(time.Millisecond + time.Duration(rnd.IntN(2000))*time.Microsecond)
				case n < 6:
					runtime.Gosched()
				case n < 11:
					time.Sleep(time.Duration(rnd.IntN(200)) * time.Microsecond)
				}
				if !rec.FencedWrite(c, fenced[key], lease) {
					st.staleRefused.Add(1)
				}
				rec.Read(c, regs[key], lease)
				if err := rec.Release(ctx, c, lease); err != nil {
					fail("release %q: %v", key, err)
				}
			}
		}()
	}
	wg.Wait()
	for _, e := range errs {
		t.Error(e)
	}
	return st
}

// check runs the checker on ops and fails the test, with the evidence and
// a visualization in the test's artifact directory, unless the result is
// Ok.
func check(t *testing.T, ops []Op, opts Options) Report {
	t.Helper()
	rep := Check(ops, opts)
	t.Logf("%v", rep)
	if rep.Result != porcupine.Ok {
		t.Errorf("history not linearizable (%s): %v\nevidence: %v", opts.Model, rep, FindEvidence(ops))
		visualize(t, rep, t.ArtifactDir())
	}
	return rep
}

func visualize(t *testing.T, rep Report, dir string) {
	t.Helper()
	path := filepath.Join(dir, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+".html")
	if err := rep.Visualize(path); err != nil {
		t.Logf("visualization: %v", err)
		return
	}
	t.Logf("visualization: %s", path)
}

// exercise runs w on l, checks the history with the exclusive model, and
// checks that the run did contend.
func exercise(t *testing.T, l *lock.Locker, w workload, strict bool) {
	t.Helper()
	rec := NewRecorder()
	start := time.Now()
	st := w.run(t, rec, l)
	t.Logf("%d clients × %d cycles over %d keys in %v: %v", w.clients, w.cycles, w.keys, time.Since(start).Round(time.Millisecond), st)
	check(t, rec.Ops(), Options{Model: Exclusive, StrictTry: strict})
	// Progress, loosely: blocking acquires always succeed, so with them at
	// least a tenth of the attempts must; tries alone fail whenever a
	// holder is descheduled, so only one in fifty must.
	want := w.clients * w.cycles / 10
	if w.tryOnly {
		want = w.clients * w.cycles / 50
	}
	if st.granted.Load() < int64(want) {
		t.Errorf("only %d leases granted for %d attempts; want at least %d", st.granted.Load(), w.clients*w.cycles, want)
	}
	if st.refused.Load() == 0 {
		t.Errorf("no TryAcquire was refused: the clients never contended")
	}
}
