package lincheck

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/fallback"
	"github.com/onceguard/onceguard/lock/redislock"
	"github.com/onceguard/onceguard/lock/sqllock"
	"github.com/onceguard/onceguard/sqldialect"
)

// fallbackRig is a fallback.Backend over redislock on a redis-server of
// the test's own and sqllock on PostgreSQL, both wrapped by the recorder:
// Redis in scope "redis#1" until it is killed, "redis#2" after (the
// restarted process has lost every lock), the database in "postgres".
type fallbackRig struct {
	srv   *redistest.Server
	rec   *Recorder
	fb    *fallback.Backend
	l     *lock.Locker
	epoch atomic.Int32

	mu      sync.Mutex
	changes []string
}

func newFallbackRig(t *testing.T, clockFences bool) *fallbackRig {
	t.Helper()
	db := dbtest.Postgres(t) // skips when ONCEGUARD_TEST_POSTGRES is unset
	srv := redistest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	sb, err := sqllock.New(db, sqldialect.Postgres, &sqllock.Options{Table: "lincheck_locks"})
	if err != nil {
		t.Fatal(err)
	}
	rb := redislock.New(rdb, &redislock.Options{Prefix: prefix(t), Timeout: 300 * time.Millisecond, ClockFences: clockFences})
	g := &fallbackRig{srv: srv, rec: NewRecorder()}
	g.epoch.Store(1)
	g.fb = fallback.New(
		g.rec.Backend(rb, func() string { return fmt.Sprintf("redis#%d", g.epoch.Load()) }),
		g.rec.Backend(sb, func() string { return "postgres" }),
		&fallback.Options{
			Cooldown: 300 * time.Millisecond,
			OnStateChange: func(from, to fallback.State, _ error) {
				g.mu.Lock()
				g.changes = append(g.changes, fmt.Sprintf("%.0fms %s->%s", float64(g.rec.Now())/1e6, from, to))
				g.mu.Unlock()
			},
		})
	g.l = lock.New(g.fb, lockerOpts)
	return g
}

// waitFor polls cond for up to 10s.
func waitFor(cond func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// split separates the Locker's history (Scope "") from the backends'.
func split(ops []Op) (locker, backends []Op) {
	for _, op := range ops {
		if op.Scope == "" {
			locker = append(locker, op)
		} else {
			backends = append(backends, op)
		}
	}
	return locker, backends
}

// Through the fallback, with Redis killed in the middle of the run and
// restarted empty later: 8 clients, 3 keys, Redis → PostgreSQL → Redis
// (with the drain that also takes the database lock). Three more clients,
// the straddlers, each take one key from Redis just before the kill and
// hold it across the switch until a holder the database granted has
// written to the key's FencedRegister; then they finish their work (a
// second fenced write, the read-back) and release.
//
// What is asserted (see the package documentation, "The fenced model"):
//
//   - every backend's own history, per Redis process lifetime and for the
//     database, passes the exclusive model: each is still a lock;
//   - the Locker's history passes the fenced model: fences strictly
//     increase in real-time order across both switches, and the fenced
//     register (the resource's fence check) never accepts a stale write;
//   - the straddlers show the break the fallback allows by design: each
//     overlapped a database holder (certain overlap, foreign read-back),
//     and each one's late write was refused as stale;
//   - no acquire fails with anything but ErrNotAcquired (the outage is
//     hidden from callers), and only leases Redis granted before it died
//     fail to release.
//
// Not asserted: mutual exclusion of the Locker's leases across the
// switch; the fallback's doc allows two holders then.
func TestFallbackRedisKilled(t *testing.T) {
	g := newFallbackRig(t, true)
	ks := newKeyset(t, 3)
	stop := make(chan struct{})
	w := workload{clients: 8, stop: stop, ks: ks, tolerant: true}
	var st *stats
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		st = w.run(t, g.rec, g.l)
	}()
	var failed string
	phase := func(what string, cond func() bool) bool {
		if failed != "" {
			return false
		}
		if !waitFor(cond) {
			failed = fmt.Sprintf("timed out waiting for %s; stats %+v", what, g.fb.Stats())
			return false
		}
		return true
	}
	var killAt, restartAt int64
	var before fallback.Stats
	var straddlers sync.WaitGroup
	var lateRefused, lateAccepted atomic.Int32
	if phase("300 leases from Redis", func() bool { return g.fb.Stats().PrimaryAcquires >= 300 }) {
		holding := make(chan error, len(ks.keys))
		for i, key := range ks.keys {
			straddlers.Add(1)
			go func() {
				defer straddlers.Done()
				c := w.clients + i
				ctx := WithClient(context.Background(), c)
				lease, err := g.rec.Acquire(ctx, c, g.l, key, ttl)
				holding <- err
				if err != nil {
					return
				}
				g.rec.Write(c, ks.regs[key], lease)
				g.rec.FencedWrite(c, ks.fenced[key], lease)
				waitFor(func() bool { last, _, _ := ks.fenced[key].Stats(); return last > lease.Fence() })
				if g.rec.FencedWrite(c, ks.fenced[key], lease) {
					lateAccepted.Add(1)
				} else {
					lateRefused.Add(1)
				}
				g.rec.Read(c, ks.regs[key], lease)
				_ = g.rec.Release(ctx, c, lease)
			}()
		}
		for range ks.keys {
			if err := <-holding; err != nil {
				t.Errorf("straddler's Acquire = %v", err)
			}
		}
		g.srv.Kill(t)
		g.epoch.Store(2) // every call from now on can only reach a new process
		killAt = g.rec.Now()
		before = g.fb.Stats()
	}
	if phase("300 leases from the database", func() bool { return g.fb.Stats().SecondaryAcquires >= before.SecondaryAcquires+300 }) &&
		// Calls made to the first process end within the 300ms timeout:
		// none may reach the second one.
		phase("the calls to the dead Redis to end", func() bool { straddlers.Wait(); return g.rec.Pending("redis#1") == 0 }) {
		g.srv.Restart(t)
		restartAt = g.rec.Now()
		before = g.fb.Stats()
	}
	phase("300 leases from the restarted Redis", func() bool {
		s := g.fb.Stats()
		return s.Recovered >= 1 && s.PrimaryAcquires >= before.PrimaryAcquires+300
	})
	close(stop)
	<-done
	straddlers.Wait()
	if failed != "" {
		t.Fatal(failed)
	}
	stats := g.fb.Stats()
	g.mu.Lock()
	t.Logf("run %v: %v; killed at %.0fms, restarted at %.0fms; breaker: %v; opened %d, recovered %d",
		time.Since(start).Round(time.Millisecond), st, float64(killAt)/1e6, float64(restartAt)/1e6, g.changes, stats.Opened, stats.Recovered)
	g.mu.Unlock()

	lockerOps, backendOps := split(g.rec.Ops())

	// Each backend on its own is a lock.
	perScope := make(map[string]int)
	held := make(map[string]map[string]bool) // owner -> scopes that granted it
	for _, op := range backendOps {
		if op.Kind == Acquire && op.Result == OK {
			perScope[op.Scope]++
			if held[op.Owner] == nil {
				held[op.Owner] = make(map[string]bool)
			}
			held[op.Owner][op.Scope] = true
		}
	}
	both := 0
	for _, s := range held {
		if len(s) > 1 {
			both++
		}
	}
	t.Logf("backend grants per scope: %v; %d leases held on both backends (drain)", perScope, both)
	for _, s := range []string{"redis#1", "postgres", "redis#2"} {
		if perScope[s] == 0 {
			t.Errorf("no grant in scope %s: the run did not exercise it", s)
		}
	}
	if stats.Opened == 0 || stats.Recovered == 0 {
		t.Errorf("breaker opened %d and recovered %d times; want both", stats.Opened, stats.Recovered)
	}
	check(t, backendOps, Options{Model: Exclusive})

	// Through the switch: fences and the resource's fence check.
	rep := check(t, lockerOps, Options{Model: Fenced})
	ev := FindEvidence(lockerOps)
	if ev.NInversions != 0 || ev.NStaleAccepts != 0 {
		t.Errorf("evidence: %v; want no fence inversion and no stale write accepted", ev)
	}
	n := int32(len(ks.keys))
	if lateRefused.Load() != n || ev.NOverlaps < int(n) || ev.NForeign < int(n) {
		t.Errorf("straddlers: %d late writes refused, %d accepted; %d certain overlaps, %d foreign reads; "+
			"want every straddler's late write refused, and at least %d overlaps and foreign reads", lateRefused.Load(), lateAccepted.Load(), ev.NOverlaps, ev.NForeign, n)
	}
	var refusedWrites, releaseFails int
	for _, op := range lockerOps {
		switch {
		case op.Kind == Acquire && op.Result != OK && op.Result != NotAcquired:
			t.Errorf("%v: %v; want no error but ErrNotAcquired to reach the caller", op, op.Err)
		case op.Kind == FencedWrite && op.Result == Refused:
			refusedWrites++
		case op.Kind == Release && op.Result != OK:
			releaseFails++
			if s := held[op.Owner]; !s["redis#1"] || len(s) != 1 {
				t.Errorf("%v: %v; only a lease granted by the first Redis alone may fail to release", op, op.Err)
			}
		}
	}
	t.Logf("Locker history: %v; overlaps (allowed here): %d certain, %d foreign reads; "+
		"stale writes the fenced register refused: %d; releases that failed (Redis gone): %d",
		rep, ev.NOverlaps, ev.NForeign, refusedWrites, releaseFails)
}

// outage makes new acquires fail as if the backend were unreachable while
// down is set. Releases still go through, so that no lease is left held
// for its TTL.
type outage struct {
	lock.Backend
	down atomic.Bool
}

func (o *outage) Acquire(ctx context.Context, r lock.Request) (lock.Grant, error) {
	if o.down.Load() {
		return lock.Grant{}, fmt.Errorf("injected outage: acquire %q: %w", r.Key, lock.ErrUnavailable)
	}
	return o.Backend.Acquire(ctx, r)
}

// The fenced model has teeth: through a fallback from Redis to a database
// and back, Redis's counter fences (seeded from the clock once, then +1)
// fall behind the database's clock fences, so once Redis serves alone
// again (after a short drain) its fences go backwards in real time, the
// misconfiguration fallback's doc warns about; the check must say
// Illegal. With redislock's ClockFences, the same run must pass. Tries
// only: a blocking redislock Acquire would move its counter up to the
// clock. The database is SQLite (always available; its fences are the
// client's clock, the same as Redis's here). Two outages on the same
// keys: in the second the database's rows exist, and their fences must
// still move past Redis's (PITFALLS 13: an existing row's fence is the
// clock's when that is higher, not its own +1).
func TestFallbackFencesAcrossOutage(t *testing.T) {
	for _, clock := range []bool{false, true} {
		name := map[bool]string{false: "counter", true: "clock"}[clock]
		t.Run(name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
			t.Cleanup(func() { _ = rdb.Close() })
			sb, err := sqllock.New(dbtest.SQLite(t), sqldialect.SQLite, nil)
			if err != nil {
				t.Fatal(err)
			}
			primary := &outage{Backend: redislock.New(rdb, &redislock.Options{ClockFences: clock})}
			fb := fallback.New(primary, sb, &fallback.Options{Cooldown: 100 * time.Millisecond, Drain: 50 * time.Millisecond})
			rec := NewRecorder()
			stop := make(chan struct{})
			done := make(chan struct{})
			var st *stats
			go func() {
				defer close(done)
				st = workload{clients: 8, stop: stop, keys: 3, tryOnly: true, tolerant: true}.run(t, rec, lock.New(fb, lockerOpts))
			}()
			var before fallback.Stats
			ok := waitFor(func() bool { return fb.Stats().PrimaryAcquires >= 150 })
			for outage := 1; ok && outage <= 2; outage++ {
				primary.down.Store(true)
				before = fb.Stats()
				ok = waitFor(func() bool { return fb.Stats().SecondaryAcquires >= before.SecondaryAcquires+150 })
				if ok {
					primary.down.Store(false)
					// Past the drain: Redis alone again, for 100 leases.
					ok = waitFor(func() bool {
						before = fb.Stats()
						return before.Recovered >= uint64(outage) && time.Now().After(before.DrainingUntil)
					}) && waitFor(func() bool { return fb.Stats().PrimaryAcquires >= before.PrimaryAcquires+100 })
				}
			}
			close(stop)
			<-done
			if !ok {
				t.Fatalf("the run did not go Redis -> database -> Redis twice: %+v", fb.Stats())
			}
			ops := rec.Ops()
			rep := Check(ops, Options{Model: Fenced})
			ev := FindEvidence(ops)
			t.Logf("%v; %v; %d fence inversions in real time", st, rep, ev.NInversions)
			switch {
			case clock && rep.Result != porcupine.Ok:
				t.Errorf("clock fences: %v; want Ok\nevidence: %v", rep, ev)
				visualize(t, rep, t.ArtifactDir())
			case !clock && rep.Result != porcupine.Illegal:
				t.Errorf("counter fences: %v; want Illegal (fences going backwards after the switch back)\nevidence: %v", rep, ev)
			}
		})
	}
}
