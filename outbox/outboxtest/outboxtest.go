// Package outboxtest is the behaviour suite of package outbox on a real
// database: Run it with a *sql.DB of each dialect you use. Its publisher
// fails, hangs, loses acks and overruns leases on purpose, and the suite
// checks that every committed event reaches the broker exactly once in
// effect (deduplicated by id), that nothing rolled back is published, and
// that several relays on one table share the work without publishing a row
// twice unless a lease ran out mid-publish.
package outboxtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/outbox"
	"github.com/onceguard/onceguard/sqldialect"
)

// Broker is a fake message broker that deduplicates by message id, as
// JetStream does by Nats-Msg-Id: a message whose id it stored before is
// acknowledged and not stored again. Behave, if set, decides each
// publish: it runs before the message is stored, and what it returns is
// the publish's answer; AckLost makes the broker store the message and
// still answer an error.
type Broker struct {
	// Behave is called for each publish with the message and how many
	// publishes of its id came before (0 on the first).
	Behave func(ctx context.Context, m outbox.Message, n int) error

	mu     sync.Mutex
	stored []outbox.Message
	seen   map[string]bool
	calls  map[string]int
}

// ErrAckLost, returned by Behave, stores the message and then fails the
// publish: the broker has it, the relay does not know.
var ErrAckLost = errors.New("outboxtest: ack lost")

// Publish implements outbox.Publisher.
func (b *Broker) Publish(ctx context.Context, m outbox.Message) error {
	b.mu.Lock()
	if b.calls == nil {
		b.calls, b.seen = map[string]int{}, map[string]bool{}
	}
	n := b.calls[m.ID]
	b.calls[m.ID]++
	b.mu.Unlock()
	var err error
	if b.Behave != nil {
		err = b.Behave(ctx, m, n)
	}
	if err != nil && !errors.Is(err, ErrAckLost) {
		return err
	}
	b.mu.Lock()
	if !b.seen[m.ID] {
		b.seen[m.ID] = true
		b.stored = append(b.stored, m)
	}
	b.mu.Unlock()
	return err
}

// Stored returns the messages the broker holds, in the order it stored them.
func (b *Broker) Stored() []outbox.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.stored)
}

// Calls returns how many publishes of id the broker answered.
func (b *Broker) Calls(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls[id]
}

// TotalCalls returns how many publishes the broker answered.
func (b *Broker) TotalCalls() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, c := range b.calls {
		n += c
	}
	return n
}

var tables atomic.Int64

// fresh returns an Outbox on a new table, dropped when t ends.
func fresh(t *testing.T, db *sql.DB, d sqldialect.Dialect) *outbox.Outbox {
	t.Helper()
	name := fmt.Sprintf("outboxtest_%d_%d", time.Now().UnixNano()%1e9, tables.Add(1))
	_, _ = db.Exec(`DROP TABLE IF EXISTS ` + name)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + name) })
	o, err := outbox.New(db, d, &outbox.Options{Table: name})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate = %v", err)
	}
	return o
}

// write commits events in one transaction.
func write(t *testing.T, db *sql.DB, o *outbox.Outbox, events ...outbox.Event) {
	t.Helper()
	if err := writeErr(db, o, events...); err != nil {
		t.Fatalf("write %d events: %v", len(events), err)
	}
}

func writeErr(db *sql.DB, o *outbox.Outbox, events ...outbox.Event) error {
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := o.Write(ctx, tx, events...); err != nil {
		return err
	}
	return tx.Commit()
}

func ev(id string) outbox.Event {
	return outbox.Event{ID: id, Subject: "test.subject", Payload: []byte(`{"id":"` + id + `"}`)}
}

func newRelay(t *testing.T, o *outbox.Outbox, p outbox.Publisher, opts outbox.RelayOptions) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(o, p, &opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func pending(t *testing.T, o *outbox.Outbox) int {
	t.Helper()
	s, err := o.Stats(context.Background())
	if err != nil {
		t.Fatalf("Stats = %v", err)
	}
	return s.Pending
}

// eventually polls cond every 20ms until it holds or 60s passed: generous,
// the machine may be loaded; the conditions are about outcomes, not speed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 60s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exactlyOnce checks that the broker stored each of ids once and nothing else.
func exactlyOnce(t *testing.T, b *Broker, ids []string) {
	t.Helper()
	got := map[string]int{}
	for _, m := range b.Stored() {
		got[m.ID]++
	}
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("broker holds %s %d times; want 1", id, got[id])
		}
		delete(got, id)
	}
	for id, n := range got {
		t.Errorf("broker holds %s (%d times), which was never committed", id, n)
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}

// Run runs the suite on db, whose dialect is d. Each subtest makes its own
// table and drops it.
func Run(t *testing.T, db *sql.DB, d sqldialect.Dialect) {
	ctx := context.Background()

	t.Run("CommitPublishesRollbackDoesNot", func(t *testing.T) {
		o := fresh(t, db, d)
		write(t, db, o, ev("a"), outbox.Event{ID: "b", Subject: "s.b", Payload: []byte("bee"), Headers: map[string][]string{"X-Kind": {"b"}}})
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := o.Write(ctx, tx, ev("rolled-back")); err != nil {
			t.Fatal(err)
		}
		if got := pending(t, o); got != 2 {
			t.Errorf("pending while a writer's tx is open = %d; want 2 (the open tx's event is not visible)", got)
		}
		_ = tx.Rollback()
		b := &Broker{}
		r := newRelay(t, o, b, outbox.RelayOptions{})
		n, err := r.RunOnce(ctx)
		if err != nil || n != 2 {
			t.Fatalf("RunOnce = %d, %v; want 2, nil", n, err)
		}
		exactlyOnce(t, b, []string{"a", "b"})
		got := b.Stored()
		if got[0].ID != "a" || got[1].ID != "b" {
			t.Errorf("published %s, %s; want the write order a, b", got[0].ID, got[1].ID)
		}
		if m := got[1]; m.Subject != "s.b" || string(m.Payload) != "bee" || m.Headers["X-Kind"][0] != "b" || m.Attempts != 0 || m.CreatedAt.IsZero() {
			t.Errorf("message b = %+v; want its subject, payload and headers as written, 0 attempts", m)
		}
		if p := pending(t, o); p != 0 {
			t.Errorf("pending after the acks = %d; want 0", p)
		}
		if n, err := r.RunOnce(ctx); err != nil || n != 0 || b.TotalCalls() != 2 {
			t.Errorf("second RunOnce = %d, %v with %d publishes in all; want nothing published again", n, err, b.TotalCalls())
		}
	})

	t.Run("DuplicateID", func(t *testing.T) {
		o := fresh(t, db, d)
		write(t, db, o, ev("dup"))
		if err := writeErr(db, o, ev("dup")); !errors.Is(err, outbox.ErrDuplicate) {
			t.Errorf("writing id dup again = %v; want ErrDuplicate", err)
		}
		if err := writeErr(db, o, outbox.Event{ID: "", Subject: "s"}); err == nil {
			t.Error("an event without id was written")
		}
		if err := writeErr(db, o, outbox.Event{ID: "x"}); err == nil {
			t.Error("an event without subject was written")
		}
		if p := pending(t, o); p != 1 {
			t.Errorf("pending = %d; want 1", p)
		}
	})

	t.Run("FailureBacksOff", func(t *testing.T) {
		o := fresh(t, db, d)
		write(t, db, o, ev("f"))
		b := &Broker{Behave: func(_ context.Context, _ outbox.Message, n int) error {
			if n < 3 {
				return errors.New("broker down")
			}
			return nil
		}}
		var afters []time.Duration
		var attempts []int
		var mu sync.Mutex
		// A long backoff: after a failure the row is not due, so an
		// immediate pass must leave it alone.
		r := newRelay(t, o, b, outbox.RelayOptions{MinBackoff: time.Hour, MaxBackoff: 4 * time.Hour,
			OnRetry: func(m outbox.Message, err error, after time.Duration) {
				mu.Lock()
				afters, attempts = append(afters, after), append(attempts, m.Attempts)
				mu.Unlock()
			}})
		if n, err := r.RunOnce(ctx); n != 0 || err != nil {
			t.Fatalf("RunOnce with the broker down = %d, %v; want 0, nil", n, err)
		}
		if n, err := r.RunOnce(ctx); n != 0 || err != nil || b.Calls("f") != 1 {
			t.Fatalf("RunOnce inside the backoff = %d, %v after %d publishes; want no new publish", n, err, b.Calls("f"))
		}
		if p := pending(t, o); p != 1 {
			t.Errorf("pending after a failed publish = %d; want 1", p)
		}
		// The retries themselves, quickly: a relay with a short backoff.
		fast := newRelay(t, o, b, outbox.RelayOptions{MinBackoff: 5 * time.Millisecond, MaxBackoff: 40 * time.Millisecond,
			OnRetry: func(m outbox.Message, err error, after time.Duration) {
				mu.Lock()
				afters, attempts = append(afters, after), append(attempts, m.Attempts)
				mu.Unlock()
			}})
		// Make the row due now: it waits an hour otherwise.
		forceDue(t, db, o)
		eventually(t, "the message is published after its failures", func() bool {
			_, err := fast.RunOnce(ctx)
			return err == nil && len(b.Stored()) == 1
		})
		exactlyOnce(t, b, []string{"f"})
		mu.Lock()
		defer mu.Unlock()
		if len(afters) != 3 || !slices.Equal(attempts, []int{0, 1, 2}) {
			t.Fatalf("retries = %v with attempts %v; want 3, attempts 0, 1, 2", afters, attempts)
		}
		if afters[0] < 30*time.Minute || afters[0] > time.Hour {
			t.Errorf("first backoff = %v; want within [MinBackoff/2, MinBackoff] = [30m, 1h]", afters[0])
		}
		// attempts 1 and 2 under the fast relay: 10ms and 20ms, jittered.
		if afters[1] < 5*time.Millisecond || afters[1] > 10*time.Millisecond || afters[2] < 10*time.Millisecond || afters[2] > 20*time.Millisecond {
			t.Errorf("backoffs = %v; want doubling per attempt with jitter: [5ms,10ms] then [10ms,20ms]", afters[1:])
		}
		if got := b.Stored()[0].Attempts; got != 3 {
			t.Errorf("the published message says %d attempts before it; want 3", got)
		}
	})

	t.Run("HangingPublishTimesOut", func(t *testing.T) {
		o := fresh(t, db, d)
		write(t, db, o, ev("h"))
		b := &Broker{Behave: func(ctx context.Context, _ outbox.Message, n int) error {
			if n == 0 {
				<-ctx.Done() // hangs until the relay gives up
				return ctx.Err()
			}
			return nil
		}}
		var retryErr error
		r := newRelay(t, o, b, outbox.RelayOptions{PublishTimeout: 50 * time.Millisecond, MinBackoff: time.Millisecond,
			OnRetry: func(_ outbox.Message, err error, _ time.Duration) { retryErr = err }})
		if n, err := r.RunOnce(ctx); n != 0 || err != nil {
			t.Fatalf("RunOnce with a hanging broker = %d, %v; want 0, nil", n, err)
		}
		if !errors.Is(retryErr, context.DeadlineExceeded) {
			t.Errorf("OnRetry's error = %v; want the publish's deadline", retryErr)
		}
		eventually(t, "the message is published after the hang", func() bool {
			_, err := r.RunOnce(ctx)
			return err == nil && len(b.Stored()) == 1
		})
		exactlyOnce(t, b, []string{"h"})
	})

	t.Run("LostAckIsDeduplicated", func(t *testing.T) {
		o := fresh(t, db, d)
		write(t, db, o, ev("l"))
		b := &Broker{Behave: func(_ context.Context, _ outbox.Message, n int) error {
			if n == 0 {
				return ErrAckLost
			}
			return nil
		}}
		r := newRelay(t, o, b, outbox.RelayOptions{MinBackoff: time.Millisecond})
		eventually(t, "the message is marked sent", func() bool {
			_, err := r.RunOnce(ctx)
			return err == nil && pending(t, o) == 0
		})
		if c := b.Calls("l"); c != 2 {
			t.Errorf("publishes of l = %d; want 2 (the first's ack was lost)", c)
		}
		exactlyOnce(t, b, []string{"l"})
	})

	t.Run("LeaseRunsOutMidPublish", func(t *testing.T) {
		o := fresh(t, db, d)
		write(t, db, o, ev("slow"))
		release := make(chan error)
		entered := make(chan struct{})
		slow := &Broker{Behave: func(context.Context, outbox.Message, int) error {
			close(entered)
			return <-release // overruns its lease, ignoring ctx: a stuck network call
		}}
		fast := &Broker{}
		var aErrs atomic.Int64
		a := newRelay(t, o, slow, outbox.RelayOptions{Lease: 200 * time.Millisecond, OnError: func(error) { aErrs.Add(1) }})
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = a.RunOnce(ctx)
		}()
		<-entered
		bRelay := newRelay(t, o, fast, outbox.RelayOptions{Lease: time.Hour})
		eventually(t, "the second relay publishes the row whose lease ran out", func() bool {
			_, err := bRelay.RunOnce(ctx)
			return err == nil && len(fast.Stored()) == 1
		})
		if p := pending(t, o); p != 0 {
			t.Errorf("pending after the second relay's ack = %d; want 0", p)
		}
		// The first relay's late failure must not put back a row that is sent.
		release <- errors.New("timed out at last")
		<-done
		if p := pending(t, o); p != 0 {
			t.Errorf("pending after the first relay's late failure = %d; want 0: the row was sent", p)
		}
		if n, err := bRelay.RunOnce(ctx); n != 0 || err != nil {
			t.Errorf("RunOnce after it all = %d, %v; want nothing more to publish", n, err)
		}
		exactlyOnce(t, fast, []string{"slow"})
		if aErrs.Load() != 0 {
			t.Errorf("the first relay reported %d database errors; want 0", aErrs.Load())
		}
	})

	t.Run("StopGivesRowsBack", func(t *testing.T) {
		o := fresh(t, db, d)
		all := ids("stop", 5)
		for _, id := range all {
			write(t, db, o, ev(id))
		}
		rctx, cancel := context.WithCancel(ctx)
		b := &Broker{Behave: func(ctx context.Context, m outbox.Message, _ int) error {
			if m.ID == all[1] {
				cancel() // the relay is told to stop while publishing its second row
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}}
		r := newRelay(t, o, b, outbox.RelayOptions{Lease: time.Hour})
		r.Run(rctx)
		if got := len(b.Stored()); got != 1 {
			t.Fatalf("stored before the stop = %d; want 1", got)
		}
		// With an hour's lease, only a give-back makes the rest due at once.
		next := newRelay(t, o, &Broker{}, outbox.RelayOptions{Lease: time.Hour})
		n, err := next.RunOnce(ctx)
		if err != nil || n != 4 {
			t.Errorf("RunOnce of another relay after the stop = %d, %v; want the 4 rows given back", n, err)
		}
	})

	t.Run("RelaysShareTheTable", func(t *testing.T) {
		o := fresh(t, db, d)
		const writers, each = 4, 60
		b := &Broker{}
		var dbErrs atomic.Int64
		rctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for range 4 {
			r := newRelay(t, o, b, outbox.RelayOptions{Batch: 16, Poll: 10 * time.Millisecond, OnError: func(err error) {
				dbErrs.Add(1)
				t.Logf("relay: %v", err)
			}})
			wg.Go(func() { r.Run(rctx) })
		}
		var all []string
		var wwg sync.WaitGroup
		var werr atomic.Value
		for w := range writers {
			mine := ids(fmt.Sprintf("w%d", w), each)
			all = append(all, mine...)
			wwg.Go(func() {
				for i := 0; i < len(mine); i += 3 {
					var evs []outbox.Event
					for _, id := range mine[i:min(i+3, len(mine))] {
						evs = append(evs, ev(id))
					}
					// Not retried: a relay must never make a writer's
					// transaction fail (a deadlock with a claim, say).
					if err := writeErr(db, o, evs...); err != nil {
						werr.Store(err)
						return
					}
				}
			})
		}
		wwg.Wait()
		if err, _ := werr.Load().(error); err != nil {
			cancel()
			wg.Wait()
			t.Fatalf("write: %v", err)
		}
		eventually(t, "every event is published", func() bool { return len(b.Stored()) >= len(all) })
		cancel()
		wg.Wait()
		exactlyOnce(t, b, all)
		// No publish overran its lease, so no row was published twice.
		if c := b.TotalCalls(); c != len(all) {
			t.Errorf("%d publishes for %d events; want one each: claims must not overlap", c, len(all))
		}
		if p := pending(t, o); p != 0 {
			t.Errorf("pending = %d; want 0", p)
		}
	})

	t.Run("StormWithFaults", func(t *testing.T) {
		o := fresh(t, db, d)
		all := ids("storm", 200)
		for i := 0; i < len(all); i += 10 {
			var evs []outbox.Event
			for _, id := range all[i : i+10] {
				evs = append(evs, ev(id))
			}
			write(t, db, o, evs...)
		}
		b := &Broker{Behave: func(ctx context.Context, _ outbox.Message, n int) error {
			if n > 3 {
				return nil // every message gets through in the end
			}
			switch rand.N(10) {
			case 0, 1:
				return errors.New("broker refused")
			case 2:
				return ErrAckLost
			case 3:
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}}
		rctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var retries atomic.Int64
		for range 3 {
			r := newRelay(t, o, b, outbox.RelayOptions{Batch: 8, Poll: 10 * time.Millisecond, PublishTimeout: 20 * time.Millisecond,
				MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond,
				OnRetry: func(outbox.Message, error, time.Duration) { retries.Add(1) },
				OnError: func(err error) { t.Logf("relay: %v", err) }})
			wg.Go(func() { r.Run(rctx) })
		}
		eventually(t, "every event is published and marked sent", func() bool {
			return len(b.Stored()) == len(all) && pending(t, o) == 0
		})
		cancel()
		wg.Wait()
		exactlyOnce(t, b, all)
		if retries.Load() == 0 {
			t.Error("no publish was retried; the faults did not happen")
		}
	})

	t.Run("StatsAndPrune", func(t *testing.T) {
		o := fresh(t, db, d)
		before := time.Now()
		write(t, db, o, ev("p1"), ev("p2"), ev("keep"))
		s, err := o.Stats(ctx)
		if err != nil || s.Pending != 3 || s.Oldest.Before(before.Add(-time.Second)) || s.Oldest.After(time.Now().Add(time.Second)) {
			t.Fatalf("Stats = %+v, %v; want 3 pending, the oldest written just now", s, err)
		}
		b := &Broker{Behave: func(_ context.Context, m outbox.Message, _ int) error {
			if m.ID == "keep" {
				return errors.New("refused")
			}
			return nil
		}}
		r := newRelay(t, o, b, outbox.RelayOptions{MinBackoff: time.Hour})
		if n, err := r.RunOnce(ctx); n != 2 || err != nil {
			t.Fatalf("RunOnce = %d, %v; want 2", n, err)
		}
		if n, err := o.Prune(ctx, time.Now().Add(-time.Hour), 0); n != 0 || err != nil {
			t.Errorf("Prune of rows sent over an hour ago = %d, %v; want 0", n, err)
		}
		if n, err := o.Prune(ctx, time.Now().Add(time.Second), 0); n != 2 || err != nil {
			t.Errorf("Prune of rows sent before now = %d, %v; want the 2 sent", n, err)
		}
		if s, err := o.Stats(ctx); err != nil || s.Pending != 1 {
			t.Errorf("Stats after prune = %+v, %v; want the unsent row kept", s, err)
		}
		// Pruned ids stay unique only within the retention: after it, an
		// id may be written again (consumers deduplicate beyond it).
		if err := writeErr(db, o, ev("p1")); err != nil {
			t.Errorf("writing a pruned id again = %v; want it accepted", err)
		}
	})

	t.Run("RunReportsAndPrunes", func(t *testing.T) {
		o := fresh(t, db, d)
		write(t, db, o, ev("r1"), ev("r2"))
		var published atomic.Int64
		stats := make(chan outbox.Stats, 100)
		b := &Broker{}
		rctx, cancel := context.WithCancel(ctx)
		r := newRelay(t, o, b, outbox.RelayOptions{Poll: 5 * time.Millisecond, StatsEvery: 5 * time.Millisecond, Retention: time.Millisecond,
			OnPublished: func(outbox.Message) { published.Add(1) },
			OnPending: func(s outbox.Stats) {
				select {
				case stats <- s:
				default:
				}
			}})
		done := make(chan struct{})
		go func() { defer close(done); r.Run(rctx) }()
		eventually(t, "both published and then pruned", func() bool {
			var n int
			if err := db.QueryRow(`SELECT COUNT(*) FROM ` + o.Table()).Scan(&n); err != nil {
				return false
			}
			return published.Load() == 2 && n == 0
		})
		eventually(t, "OnPending reports an empty backlog", func() bool {
			select {
			case s := <-stats:
				return s.Pending == 0
			default:
				return false
			}
		})
		cancel()
		<-done
		exactlyOnce(t, b, []string{"r1", "r2"})
	})
}

// forceDue makes o's unsent rows due now.
func forceDue(t *testing.T, db *sql.DB, o *outbox.Outbox) {
	t.Helper()
	q := `UPDATE ` + o.Table() + ` SET due_at = 0 WHERE sent_at IS NULL`
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}
