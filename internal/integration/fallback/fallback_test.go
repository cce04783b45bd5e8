package fallback_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/leakcheck"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/onceguard/onceguard/internal/redistest"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/fallback"
	"github.com/onceguard/onceguard/lock/locktest"
	"github.com/onceguard/onceguard/lock/memlock"
	"github.com/onceguard/onceguard/lock/redislock"
	"github.com/onceguard/onceguard/lock/sqllock"
	"github.com/onceguard/onceguard/sqldialect"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{})
	leakcheck.VerifyTestMain(m,
		leakcheck.IgnoreTopFunction(redistest.SpawnerFunction),
		leakcheck.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
		leakcheck.IgnoreAnyFunction("database/sql.(*DB).connectionOpener"))
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestConformanceMemory(t *testing.T) {
	locktest.Run(t, func(*testing.T) lock.Backend {
		return fallback.New(&memlock.Backend{}, &memlock.Backend{}, nil)
	})
}

// backends starts a Redis the test owns and an SQLite file.
func backends(t *testing.T) (*redistest.Server, *redislock.Backend, *sqllock.Backend) {
	t.Helper()
	srv := redistest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "l.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	sb, err := sqllock.New(db, sqldialect.SQLite, nil)
	if err != nil {
		t.Fatal(err)
	}
	return srv, redislock.New(rdb, &redislock.Options{Timeout: 300 * time.Millisecond}), sb
}

func TestConformanceRedisSQLite(t *testing.T) {
	_, rb, sb := backends(t)
	locktest.Run(t, func(*testing.T) lock.Backend { return fallback.New(rb, sb, nil) },
		"database/sql.(*DB).connectionOpener")
}

// Kill Redis during a stream of acquires: no acquire fails, the breaker
// opens and the database serves; restart it: Redis serves again.
func TestRedisKilled(t *testing.T) {
	srv, rb, sb := backends(t)
	var changes []string
	var mu sync.Mutex
	b := fallback.New(rb, sb, &fallback.Options{
		Cooldown: 200 * time.Millisecond,
		OnStateChange: func(from, to fallback.State, cause error) {
			mu.Lock()
			changes = append(changes, from.String()+"->"+to.String())
			mu.Unlock()
		},
	})
	l := lock.New(b, nil)
	ctx := context.Background()

	var (
		cycles, acquireErrs, releaseErrs atomic.Int64
		stop                             atomic.Bool
		wg                               sync.WaitGroup
	)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				lease, err := l.TryAcquire(ctx, fmt.Sprintf("stream/%d/%d", g, i), 5*time.Second)
				if err != nil {
					acquireErrs.Add(1)
					t.Errorf("TryAcquire during the outage = %v; want no error to reach the caller", err)
					return
				}
				if err := lease.Release(ctx); err != nil {
					// Only a lease Redis granted just before it died may
					// fail to release: unreachable while it is down, or
					// gone (expired) once it restarted without its data.
					if !errors.Is(err, lock.ErrUnavailable) && !errors.Is(err, lock.ErrNotHeld) {
						t.Errorf("Release = %v; want nil, ErrUnavailable or ErrNotHeld", err)
					}
					releaseErrs.Add(1)
				}
				cycles.Add(1)
			}
		}()
	}
	waitFor(t, "cycles on Redis", func() bool { return b.Stats().PrimaryAcquires > 200 })
	srv.Kill(t)
	waitFor(t, "cycles on the database", func() bool { return b.Stats().SecondaryAcquires > 200 })
	if !b.Degraded() {
		t.Errorf("Degraded() = false with Redis dead; want true")
	}
	srv.Restart(t)
	before := b.Stats().PrimaryAcquires
	waitFor(t, "Redis serving again", func() bool {
		s := b.Stats()
		return s.State == fallback.Closed && s.PrimaryAcquires > before+200
	})
	stop.Store(true)
	wg.Wait()

	s := b.Stats()
	t.Logf("%d cycles, %d release errors; stats %+v; changes %v", cycles.Load(), releaseErrs.Load(), s, changes)
	if acquireErrs.Load() != 0 {
		t.Errorf("%d acquires failed; want 0", acquireErrs.Load())
	}
	if s.Opened < 1 || s.Recovered < 1 {
		t.Errorf("Opened, Recovered = %d, %d; want both >= 1", s.Opened, s.Recovered)
	}
	if releaseErrs.Load() > 8 {
		t.Errorf("%d release errors; want at most one per goroutine (the lease in flight when Redis died)", releaseErrs.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	// A probe that succeeds closes the breaker even if a request that
	// started before the outage failed late and re-opened it meanwhile.
	if len(changes) < 2 || changes[0] != "closed->open" || !strings.HasSuffix(changes[len(changes)-1], "->closed") {
		t.Errorf("state changes %v; want closed->open first and ...->closed last", changes)
	}

	// Redis really holds the locks again.
	lease, err := l.TryAcquire(ctx, "after", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := srv.Do("GET", "onceguard:lock:{after}"); err != nil || got != lease.Token() {
		t.Errorf("GET in Redis = %v, %v; want the lease's owner token", got, err)
	}
	_ = lease.Release(ctx)
}

// A lease the database granted during the outage is still respected after
// Redis comes back (the drain period).
func TestDrainAfterRecovery(t *testing.T) {
	srv, rb, sb := backends(t)
	b := fallback.New(rb, sb, &fallback.Options{Cooldown: 100 * time.Millisecond})
	l := lock.New(b, nil)
	ctx := context.Background()
	srv.Kill(t)
	held, err := l.TryAcquire(ctx, "account:1", 30*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire with Redis dead = %v", err)
	}
	srv.Restart(t)
	time.Sleep(150 * time.Millisecond) // past the cooldown
	waitFor(t, "breaker closed", func() bool {
		if lease, err := l.TryAcquire(ctx, "probe", time.Second); err == nil {
			_ = lease.Release(ctx)
		}
		return b.State() == fallback.Closed
	})
	before := b.Stats().PrimaryAcquires
	if _, err := l.TryAcquire(ctx, "account:1", time.Second); !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("TryAcquire on Redis of a lock the database still holds = %v; want ErrNotAcquired", err)
	}
	if n := b.Stats().PrimaryAcquires; n != before {
		t.Errorf("PrimaryAcquires %d after an acquire the drain refused; want %d (no lease granted)", n, before)
	}
	if err := held.Release(ctx); err != nil {
		t.Errorf("Release on the database = %v", err)
	}
	lease, err := l.TryAcquire(ctx, "account:1", time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after release = %v", err)
	}
	if lease.Fence() <= held.Fence() {
		t.Errorf("fence across backends %d; want > %d", lease.Fence(), held.Fence())
	}
	_ = lease.Release(ctx)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Probe moves the breaker without any acquire: a service whose lock
// traffic stopped during an outage is back on the primary (and ready, not
// degraded) as soon as a check probes it after the cooldown.
func TestProbeClosesWithoutTraffic(t *testing.T) {
	srv, rb, sb := backends(t)
	// The cooldown must outlast a Redis restart for the check inside the
	// new cooldown below; on a loaded machine a restart took over 100ms.
	const cooldown = 500 * time.Millisecond
	b := fallback.New(rb, sb, &fallback.Options{Cooldown: cooldown})
	l := lock.New(b, nil)
	ctx := context.Background()
	if got := b.Probe(ctx); got != fallback.Closed {
		t.Errorf("Probe with the breaker closed = %v; want closed, nothing done", got)
	}
	srv.Kill(t)
	lease, err := l.TryAcquire(ctx, "k", time.Second) // trips the breaker, served by the database
	if err != nil {
		t.Fatalf("TryAcquire with Redis dead = %v", err)
	}
	_ = lease.Release(ctx)
	if got := b.Probe(ctx); got != fallback.Open {
		t.Errorf("Probe inside the cooldown = %v; want open, nothing tried", got)
	}
	time.Sleep(cooldown + 50*time.Millisecond)
	reopened := time.Now() // the breaker reopens after this, inside the Probe
	if got := b.Probe(ctx); got != fallback.Open {
		t.Errorf("Probe after the cooldown, Redis still dead = %v; want open again", got)
	}
	if s := b.Stats(); s.Recovered != 0 || s.Opened != 1 {
		t.Errorf("stats %+v; want opened once, not recovered", s)
	}
	srv.Restart(t)
	got := b.Probe(ctx)
	if took := time.Since(reopened); took < cooldown {
		if got != fallback.Open {
			t.Errorf("Probe inside the new cooldown = %v; want open", got)
		}
	} else {
		// Still inside it is not something this run can check: the
		// restart outlasted the cooldown. What follows holds either way.
		t.Logf("Redis restart took %v, over the %v cooldown: probe answered %v", took, cooldown, got)
	}
	time.Sleep(cooldown + 50*time.Millisecond)
	if got := b.Probe(ctx); got != fallback.Closed {
		t.Errorf("Probe after the cooldown, Redis back = %v; want closed", got)
	}
	if s := b.Stats(); s.Recovered != 1 {
		t.Errorf("stats %+v; want recovered once", s)
	}
	if got, err := srv.Do("EXISTS", "onceguard:lock:{"+fallback.ProbeKey+"}"); err != nil || got != int64(0) {
		t.Errorf("the probe's lock in Redis: EXISTS = %v, %v; want 0 (released)", got, err)
	}
	lease, err = l.TryAcquire(ctx, "k", time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after the probe = %v", err)
	}
	if got, err := srv.Do("GET", "onceguard:lock:{k}"); err != nil || got != lease.Token() {
		t.Errorf("GET in Redis = %v, %v; want the lease's owner token: Redis serves again", got, err)
	}
	_ = lease.Release(ctx)
}
