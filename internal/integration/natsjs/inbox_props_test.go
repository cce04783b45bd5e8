package natsjs_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/natsjs"
)

// lostAckMsg is a message whose Ack reports success and sends nothing,
// as an ack lost on its way to the server.
type lostAckMsg struct{ jetstream.Msg }

func (lostAckMsg) Ack() error { return nil }

// crashAfterCommitMsg is a message whose Ack fails without reaching the
// server, as a process dying between its commit and its ack.
type crashAfterCommitMsg struct{ jetstream.Msg }

func (crashAfterCommitMsg) Ack() error { return errors.New("process died before its ack") }

// next fetches cons's next message, or fails after 10 seconds.
func next(t *testing.T, cons jetstream.Consumer) jetstream.Msg {
	t.Helper()
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("no message in 10 s: %v", err)
	}
	return msg
}

func delivered(t *testing.T, msg jetstream.Msg) uint64 {
	t.Helper()
	md, err := msg.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	return md.NumDelivered
}

// A message handled and committed whose ack is lost (or whose process
// dies between commit and ack) is redelivered by JetStream; the
// redelivery is acked without running the handler, on every database.
func TestInboxRedeliveredAfterCommit(t *testing.T) {
	for _, d := range databases {
		for _, lost := range []struct {
			name string
			wrap func(jetstream.Msg) jetstream.Msg
		}{
			{"lost-ack", func(m jetstream.Msg) jetstream.Msg { return lostAckMsg{m} }},
			{"crash-before-ack", func(m jetstream.Msg) jetstream.Msg { return crashAfterCommitMsg{m} }},
		} {
			t.Run(d.name+"/"+lost.name, func(t *testing.T) {
				js := jsFor(t)
				a := appOn(t, d)
				stream, name := newStream(t, js)
				ctx := context.Background()
				cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "app", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				publish(t, js, name+".x", 2) // one with a Nats-Msg-Id, one identified by its sequence

				var calls atomic.Int32
				h := func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
					calls.Add(1)
					return a.handle(ctx, tx, msg)
				}
				for range 2 {
					msg := next(t, cons)
					ran, err := a.inbox.Process(ctx, lost.wrap(msg), h)
					if !ran {
						t.Fatalf("first delivery: Process = %v, %v; want ran", ran, err)
					}
				}
				for range 2 { // AckWait (1 s) later, both again
					msg := next(t, cons)
					if n := delivered(t, msg); n != 2 {
						t.Fatalf("delivery %d of %q; want its redelivery (2)", n, msg.Data())
					}
					ran, err := a.inbox.Process(ctx, msg, h)
					if ran || err != nil {
						t.Errorf("redelivery of %q: Process = %v, %v; want not ran, nil (acked)", msg.Data(), ran, err)
					}
				}
				drained(t, cons, a, 2) // the redeliveries acked: nothing pending
				if got, doubled := a.rows(t); got != 2 || doubled != 0 || calls.Load() != 2 {
					t.Errorf("%d rows, %d ids twice, handler ran %d times; want 2, none, 2", got, doubled, calls.Load())
				}
			})
		}
	}
}

// Two Inbox instances (two connections, two pools, as two processes)
// consume one durable consumer whose AckWait is shorter than some
// handlers take, so that those messages are delivered again to the
// other instance while the first still holds them: every message's
// effect is made exactly once.
func TestInboxTwoInstancesOneDurable(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			js := jsFor(t)
			driver, dsn := d.dsn(t)
			table, source := tableFor(t, d), fmt.Sprint("test/", time.Now().UnixNano())
			a := openApp(t, d.dialect, driver, dsn, table, source)
			b := openApp(t, d.dialect, driver, dsn, table, source)
			a.inbox.Lease, b.inbox.Lease = 5*time.Second, 5*time.Second
			stream, name := newStream(t, js)
			ctx := context.Background()
			cfg := jetstream.ConsumerConfig{Durable: "app", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 500 * time.Millisecond}
			if _, err := stream.CreateOrUpdateConsumer(ctx, cfg); err != nil {
				t.Fatal(err)
			}
			const n = 24
			publish(t, js, name+".x", n)

			var mu sync.Mutex
			committed := map[string]int{} // id: handler runs that returned nil
			var slowRedelivered atomic.Int32
			handler := func(app *app) natsjs.Handler {
				return func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
					id, _ := natsjs.MsgID(msg)
					var i int
					_, _ = fmt.Sscanf(string(msg.Data()), "message %d", &i)
					if i%6 == 0 { // slow: outlives AckWait, redelivered meanwhile to either instance
						md, _ := msg.Metadata()
						if md != nil && md.NumDelivered > 1 {
							slowRedelivered.Add(1)
						}
						select {
						case <-time.After(1200 * time.Millisecond): // simulated work, not an assertion
						case <-ctx.Done():
							return ctx.Err()
						}
					}
					if err := app.handle(ctx, tx, msg); err != nil {
						return err
					}
					mu.Lock()
					committed[id]++
					mu.Unlock()
					return nil
				}
			}
			// Each instance with its own connection and consumer handle.
			consB, err := jsFor(t).Consumer(ctx, name, "app")
			if err != nil {
				t.Fatal(err)
			}
			consA, err := js.Consumer(ctx, name, "app")
			if err != nil {
				t.Fatal(err)
			}
			var inProgress atomic.Int32
			onErr := func(_ jetstream.Msg, err error) {
				if errors.Is(err, idempotency.ErrInProgress) {
					inProgress.Add(1)
				}
			}
			a.inbox.OnError, b.inbox.OnError = onErr, onErr
			stopA := consume(t, a, consA, handler(a))
			stopB := consume(t, b, consB, handler(b))
			drained(t, consA, a, n)
			stopA()
			stopB()
			if got, doubled := a.rows(t); got != n || doubled != 0 {
				t.Errorf("%d rows, %d ids twice; want %d, none", got, doubled, n)
			}
			mu.Lock()
			defer mu.Unlock()
			for id, c := range committed {
				if c != 1 {
					t.Errorf("message %s: handler returned nil %d times (a transaction that must have rolled back?); rows say once", id, c)
				}
			}
			t.Logf("slow messages handled on a redelivery: %d; deliveries nak'ed as in progress: %d", slowRedelivered.Load(), inProgress.Load())
		})
	}
}

// Consume stops when its context ends, also in the middle of a handler
// (whose transaction then rolls back), returns nil, and loses nothing: a
// later Consume handles every message left, each once.
func TestInboxConsumeCancelled(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			js := jsFor(t)
			a := appOn(t, d)
			stream, name := newStream(t, js)
			ctx := context.Background()
			cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "app", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			const n, cancelAt = 30, 10
			publish(t, js, name+".x", n)

			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			var handled atomic.Int32
			done := make(chan error, 1)
			go func() {
				done <- a.inbox.Consume(cctx, cons, func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
					if err := a.handle(ctx, tx, msg); err != nil {
						return err
					}
					if handled.Add(1) == cancelAt {
						cancel() // the shutdown arrives inside this handler, before its commit
					}
					return nil
				})
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Consume = %v; want nil after its context ended", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("Consume did not return within a minute of its context ending")
			}
			if got, doubled := a.rows(t); got > cancelAt || doubled != 0 {
				t.Fatalf("after the cancel: %d rows, %d twice; want at most %d, none", got, doubled, cancelAt)
			}
			stop := consume(t, a, cons, a.handle)
			drained(t, cons, a, n)
			stop()
			if got, doubled := a.rows(t); got != n || doubled != 0 {
				t.Errorf("%d rows, %d ids twice; want %d, none", got, doubled, n)
			}
		})
	}
}

// A consumer with MaxDeliver, configured as Inbox's documentation says
// (Lease above the handler's time and below AckWait × MaxDeliver): a
// delivery that dies inside its handler (here: hangs past the test, as a
// process frozen or killed before its commit) holds its message until its
// lease runs out. The message must still be handled once the lease has
// run out, not spend its remaining deliveries being nak'ed as "in
// progress" at 100 ms, 200 ms, 400 ms and be dropped by the server.
func TestInboxInProgressKeepsDeliveries(t *testing.T) {
	d := databases[0] // SQLite: the Inbox's nak delay does not depend on the database
	js := jsFor(t)
	a := appOn(t, d)
	const ackWait, maxDeliver, lease = time.Second, 4, 3 * time.Second // 3 s < 1 s × 4
	a.inbox.Lease = lease
	a.inbox.Backoff = nil // the documented default: 100 ms doubling
	stream, name := newStream(t, js)
	ctx := context.Background()
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "app", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: ackWait, MaxDeliver: maxDeliver})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, js, name+".x", 1)

	// The first delivery takes the message and never finishes (until the
	// test ends; its error then rolls back and is nak'ed into nothing).
	first := next(t, cons)
	release := make(chan struct{})
	firstDone := make(chan struct{})
	go func() {
		defer close(firstDone)
		_, _ = a.inbox.Process(ctx, first, func(context.Context, *sql.Tx, jetstream.Msg) error {
			<-release // hung: neither commits nor gives the message back
			return errors.New("died")
		})
	}()
	t.Cleanup(func() { close(release); <-firstDone })

	var handled atomic.Int32
	var inProgress atomic.Int32
	b := *a.inbox
	b.OnError = func(_ jetstream.Msg, err error) { inProgress.Add(1) }
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- b.Consume(cctx, cons, func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
			handled.Add(1)
			return a.handle(ctx, tx, msg)
		})
	}()
	defer func() { cancel(); <-done }()

	hung := time.Now()
	for handled.Load() == 0 {
		if time.Since(hung) > lease+10*time.Second { // well past the lease
			info, err := cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Fatalf("the message was never handled %v after its holder hung (lease %v): nak'ed as in progress %d times, "+
				"then the consumer stopped delivering it (MaxDeliver %d): %d pending, %d unacknowledged; lost",
				time.Since(hung).Round(time.Second), lease, inProgress.Load(), maxDeliver, info.NumPending, info.NumAckPending)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition
	}
	t.Logf("handled %v after its holder hung, after %d in-progress naks", time.Since(hung).Round(100*time.Millisecond), inProgress.Load())
	drained(t, cons, a, 1)
	if got, _ := a.rows(t); got != 1 {
		t.Errorf("%d rows; want 1", got)
	}
}

// oddMsg is a message as odd as a jetstream.Msg can come: no headers, no
// JetStream metadata (a core NATS reply, say). Only what Process may call
// is implemented.
type oddMsg struct {
	jetstream.Msg
	termed, naked, acked atomic.Int32
}

func (*oddMsg) Headers() nats.Header { return nil }
func (*oddMsg) Data() []byte         { return nil }
func (*oddMsg) Subject() string      { return "odd" }
func (*oddMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return nil, jetstream.ErrNotJSMessage
}
func (m *oddMsg) Term() error                      { m.termed.Add(1); return nil }
func (m *oddMsg) Nak() error                       { m.naked.Add(1); return nil }
func (m *oddMsg) NakWithDelay(time.Duration) error { m.naked.Add(1); return nil }
func (m *oddMsg) Ack() error                       { m.acked.Add(1); return nil }
func (m *oddMsg) TermWithReason(string) error      { m.termed.Add(1); return nil }
func (m *oddMsg) DoubleAck(context.Context) error  { m.acked.Add(1); return nil }
func (m *oddMsg) InProgress() error                { return nil }
func (m *oddMsg) Reply() string                    { return "" }
func (m *oddMsg) RawData() []byte                  { return nil }

// A message without headers nor metadata does not panic Process: with the
// default id it is terminated (ErrNoID), never handled; with an id of the
// caller's, a failing handler naks it (delivery count unknown: 1).
func TestInboxOddMessage(t *testing.T) {
	d := databases[0]
	a := appOn(t, d)
	a.inbox.ID = nil
	ctx := context.Background()
	m := &oddMsg{}
	ran, err := a.inbox.Process(ctx, m, func(context.Context, *sql.Tx, jetstream.Msg) error {
		t.Error("handler ran for a message without an id")
		return nil
	})
	if ran || !errors.Is(err, natsjs.ErrNoID) || m.termed.Load() != 1 || m.acked.Load()+m.naked.Load() != 0 {
		t.Errorf("Process(no headers, no metadata) = %v, %v (term %d, ack %d, nak %d); want ErrNoID, terminated only",
			ran, err, m.termed.Load(), m.acked.Load(), m.naked.Load())
	}

	a.inbox.ID = func(jetstream.Msg) (string, error) { return "odd-1", nil }
	m = &oddMsg{}
	ran, err = a.inbox.Process(ctx, m, func(context.Context, *sql.Tx, jetstream.Msg) error { return errors.New("boom") })
	if ran || err == nil || m.naked.Load() != 1 || m.acked.Load() != 0 {
		t.Errorf("Process(failing handler, no metadata) = %v, %v (nak %d, ack %d); want the error, nak'ed", ran, err, m.naked.Load(), m.acked.Load())
	}
	ran, err = a.inbox.Process(ctx, m, func(context.Context, *sql.Tx, jetstream.Msg) error { return nil })
	if !ran || err != nil || m.acked.Load() != 1 {
		t.Errorf("Process(again, handler ok) = %v, %v (ack %d); want ran, acked", ran, err, m.acked.Load())
	}
}

// Processed ids are not kept forever: past the Inbox's TTL the store's
// prune (one Begin in PruneEvery) deletes their records.
func TestInboxRecordsPruned(t *testing.T) {
	d := databases[0]
	js := jsFor(t)
	a := appOn(t, d)
	store, err := sqlstore.New(a.db, d.dialect, &sqlstore.Options{Prefix: "natsjs_", PruneEvery: 1})
	if err != nil {
		t.Fatal(err)
	}
	a.inbox.Store, a.inbox.TTL = store, time.Second
	stream, name := newStream(t, js)
	ctx := context.Background()
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "app", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	records := func() (n int) {
		if err := a.db.QueryRow(`SELECT COUNT(*) FROM natsjs_idempotency`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	publish(t, js, name+".x", 1)
	if ran, err := a.inbox.Process(ctx, next(t, cons), a.handle); !ran || err != nil {
		t.Fatalf("Process = %v, %v", ran, err)
	}
	if n := records(); n != 1 {
		t.Fatalf("%d records after one message; want 1", n)
	}
	for expired := time.Now().Add(1200 * time.Millisecond); time.Now().Before(expired); {
		time.Sleep(50 * time.Millisecond) // until the first record's TTL (1 s) has passed
	}
	if _, err := js.Publish(ctx, name+".y", []byte("another"), jetstream.WithMsgID("evt-other")); err != nil {
		t.Fatal(err)
	}
	if ran, err := a.inbox.Process(ctx, next(t, cons), a.handle); err != nil {
		t.Fatalf("Process = %v, %v", ran, err)
	}
	if n := records(); n != 1 {
		t.Errorf("%d records after the first one's TTL and a prune; want 1 (the expired one deleted)", n)
	}
}
