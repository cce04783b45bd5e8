package natsjs_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite" // driver "sqlite"

	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/internal/dbtest"
	"github.com/onceguard/onceguard/natsjs"
	"github.com/onceguard/onceguard/sqldialect"
)

// database is one SQL database the tests run on.
type database struct {
	name    string
	dialect sqldialect.Dialect
	// dsn returns the driver name and DSN of a database for t (SQLite: a
	// new file; PostgreSQL: ONCEGUARD_TEST_POSTGRES, or a skip; MySQL: a
	// fresh database on ONCEGUARD_TEST_MYSQL's server, or a skip). Call it
	// once per test: MySQL's re-creates its database.
	dsn func(t *testing.T) (driver, dsn string)
}

var databases = []database{
	{"sqlite", sqldialect.SQLite, func(t *testing.T) (string, string) {
		return "sqlite", "file:" + filepath.Join(t.TempDir(), "app.db") + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
	}},
	{"postgres", sqldialect.Postgres, func(t *testing.T) (string, string) {
		dsn := os.Getenv("ONCEGUARD_TEST_POSTGRES")
		if dsn == "" {
			t.Skip("ONCEGUARD_TEST_POSTGRES not set; skipping")
		}
		return "pgx", dsn
	}},
	{"mysql", sqldialect.MySQL, func(t *testing.T) (string, string) {
		return "mysql", dbtest.FreshMySQL(t, "natsjs_inbox") // a skip without ONCEGUARD_TEST_MYSQL
	}},
}

// app is the consuming application of a test: its database, a table of
// effects (one row per message handled) and the Inbox on it.
type app struct {
	dialect sqldialect.Dialect
	db      *sql.DB
	table   string
	inbox   *natsjs.Inbox
}

func openApp(t testing.TB, dialect sqldialect.Dialect, driver, dsn, table, source string) *app {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = db.Close() })
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS ` + table + ` (msg_id VARCHAR(200) NOT NULL, body VARCHAR(200) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := sqlstore.New(db, dialect, &sqlstore.Options{Prefix: "natsjs_"})
	if err != nil {
		t.Fatal(err)
	}
	return &app{dialect: dialect, db: db, table: table, inbox: &natsjs.Inbox{Store: store, Source: source, Lease: 2 * time.Second,
		Backoff: func(uint64) time.Duration { return 50 * time.Millisecond }}}
}

// handle records one effect row for msg in tx.
func (a *app) handle(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
	id, err := natsjs.MsgID(msg)
	if err != nil {
		return err
	}
	q := `INSERT INTO ` + a.table + ` (msg_id, body) VALUES (?, ?)`
	if a.dialect == sqldialect.Postgres {
		q = `INSERT INTO ` + a.table + ` (msg_id, body) VALUES ($1, $2)`
	}
	_, err = tx.ExecContext(ctx, q, id, string(msg.Data()))
	return err
}

// rows returns how many effect rows there are, and how many ids have more
// than one.
func (a *app) rows(t testing.TB) (n, doubled int) {
	t.Helper()
	if err := a.db.QueryRow(`SELECT COUNT(*) FROM ` + a.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err := a.db.QueryRow(`SELECT COUNT(*) FROM (SELECT msg_id FROM ` + a.table + ` GROUP BY msg_id HAVING COUNT(*) > 1) d`).Scan(&doubled); err != nil {
		t.Fatal(err)
	}
	return n, doubled
}

// jsFor connects to ONCEGUARD_TEST_NATS, or skips.
func jsFor(t testing.TB) jetstream.JetStream {
	t.Helper()
	url := os.Getenv("ONCEGUARD_TEST_NATS")
	if url == "" {
		t.Skip("ONCEGUARD_TEST_NATS not set; skipping")
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// newStream creates a stream with a unique name on subject <name>.> and
// deletes it when the test ends.
func newStream(t testing.TB, js jetstream.JetStream) (jetstream.Stream, string) {
	t.Helper()
	name := fmt.Sprintf("NATSJS_TEST_%d_%d", os.Getpid(), time.Now().UnixNano())
	ctx := context.Background()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	return s, name
}

// publish publishes n messages to subject, those with an even number with
// a Nats-Msg-Id, the others without (identified by their sequence).
func publish(t testing.TB, js jetstream.JetStream, subject string, n int) {
	t.Helper()
	for i := range n {
		var opts []jetstream.PublishOpt
		if i%2 == 0 {
			opts = append(opts, jetstream.WithMsgID(fmt.Sprint("evt-", i)))
		}
		if _, err := js.Publish(context.Background(), subject, []byte(fmt.Sprint("message ", i)), opts...); err != nil {
			t.Fatal(err)
		}
	}
}

// drained waits until cons has nothing pending nor unacknowledged and
// the app has want rows, or fails after a minute.
func drained(t testing.TB, cons jetstream.Consumer, a *app, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		info, err := cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		n, _ := a.rows(t)
		if info.NumPending == 0 && info.NumAckPending == 0 && n >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained after a minute: %d pending, %d unacknowledged, %d rows (want %d)", info.NumPending, info.NumAckPending, n, want)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, not a synchronisation
	}
}

func consume(t testing.TB, a *app, cons jetstream.Consumer, h natsjs.Handler) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.inbox.Consume(ctx, cons, h) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Consume = %v; want nil after its context ended", err)
		}
	}
}

// appOn is openApp on d, with a table and a source of its own.
func appOn(t *testing.T, d database) *app {
	t.Helper()
	driver, dsn := d.dsn(t)
	return openApp(t, d.dialect, driver, dsn, tableFor(t, d), fmt.Sprint("test/", time.Now().UnixNano()))
}

// tableFor returns a table name for t's effects, dropped when t ends.
func tableFor(t testing.TB, db database) string {
	t.Helper()
	name := fmt.Sprintf("natsjs_fx_%d_%d", os.Getpid(), time.Now().UnixNano())
	if db.dialect == sqldialect.Postgres {
		driver, dsn := db.dsn(t.(*testing.T))
		t.Cleanup(func() {
			if c, err := sql.Open(driver, dsn); err == nil {
				_, _ = c.Exec(`DROP TABLE IF EXISTS ` + name)
				_ = c.Close()
			}
		})
	}
	return name
}

// Every message is handled once: those with a Nats-Msg-Id and those
// without; a handler failing on a message's first delivery rolls back and
// the redelivery handles it; the same event id arriving again (here
// through another stream) is acked without a second effect.
func TestInbox(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			js := jsFor(t)
			a := appOn(t, d)
			stream, name := newStream(t, js)
			ctx := context.Background()
			cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "app", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			const n = 10
			publish(t, js, name+".x", n)

			var failing, calls atomic.Int32
			boom := errors.New("boom")
			stop := consume(t, a, cons, func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
				if err := a.handle(ctx, tx, msg); err != nil {
					return err
				}
				if string(msg.Data()) == "message 3" {
					if calls.Add(1) == 1 {
						failing.Add(1)
						return boom // after its write: rolled back
					}
				}
				return nil
			})
			drained(t, cons, a, n)
			stop()
			if got, doubled := a.rows(t); got != n || doubled != 0 {
				t.Errorf("%d rows, %d ids twice; want %d, none", got, doubled, n)
			}
			if calls.Load() != 2 || failing.Load() != 1 {
				t.Errorf("message 3 handled %d times, failed %d; want 2, 1 (the failure rolled back, redelivered)", calls.Load(), failing.Load())
			}

			// The event evt-0 again, published to another stream the app
			// also consumes: acked, not handled.
			other, otherName := newStream(t, js)
			otherCons, err := other.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "app", AckPolicy: jetstream.AckExplicitPolicy})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := js.Publish(ctx, otherName+".x", []byte("message 0 again"), jetstream.WithMsgID("evt-0")); err != nil {
				t.Fatal(err)
			}
			msg, err := otherCons.Next(jetstream.FetchMaxWait(10 * time.Second))
			if err != nil {
				t.Fatal(err)
			}
			ran, err := a.inbox.Process(ctx, msg, a.handle)
			if err != nil || ran {
				t.Errorf("Process of evt-0 again = %v, %v; want not ran, nil", ran, err)
			}
			drained(t, otherCons, a, n)
			if got, _ := a.rows(t); got != n {
				t.Errorf("%d rows after evt-0 again; want still %d", got, n)
			}
		})
	}
}

// The child process's settings, passed in its environment.
const (
	envChild = "NATSJS_TEST_CHILD" // after-commit or in-handler
	envArgs  = "NATSJS_TEST_ARGS"  // dialect|driver|dsn|table|source|stream|consumer|kill at
)

// A consumer killed with SIGKILL mid-batch and restarted applies each
// message's effect exactly once: killed after committing a message and
// before acking it (its redelivery is acked without a second effect), or
// inside the handler before the commit (its record left in flight is
// taken over when its lease has run out, and the message handled once).
func TestKilledMidBatch(t *testing.T) {
	if mode := os.Getenv(envChild); mode != "" {
		child(t, mode)
		return
	}
	for _, d := range databases {
		for _, mode := range []string{"after-commit", "in-handler"} {
			t.Run(d.name+"/"+mode, func(t *testing.T) {
				js := jsFor(t)
				driver, dsn := d.dsn(t)
				table, source := tableFor(t, d), fmt.Sprint("test/", time.Now().UnixNano())
				a := openApp(t, d.dialect, driver, dsn, table, source)
				stream, name := newStream(t, js)
				ctx := context.Background()
				cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "app", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				const n, killAt = 40, 15
				publish(t, js, name+".x", n)

				cmd := exec.Command(os.Args[0], "-test.run=^TestKilledMidBatch$", "-test.count=1")
				cmd.Env = append(os.Environ(), envChild+"="+mode,
					envArgs+"="+strings.Join([]string{strconv.Itoa(int(d.dialect)), driver, dsn, table, source, name, "app", strconv.Itoa(killAt)}, "|"))
				cmd.Stderr = os.Stderr
				out, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				reached := make(chan string, 1)
				go func() {
					sc := bufio.NewScanner(out)
					for sc.Scan() {
						if line := sc.Text(); strings.HasPrefix(line, "natsjs-child: ") {
							reached <- line
							return
						}
					}
					close(reached)
				}()
				select {
				case line, ok := <-reached:
					if !ok {
						_ = cmd.Wait()
						t.Fatal("the child ended before its kill point")
					}
					t.Log(line)
				case <-time.After(2 * time.Minute):
					t.Fatal("the child did not reach its kill point in 2 minutes")
				}
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				_ = cmd.Wait()

				wantBefore := killAt // committed, the last one not acked
				if mode == "in-handler" {
					wantBefore = killAt - 1 // the last one's transaction died with the process
				}
				if got, doubled := a.rows(t); got != wantBefore || doubled != 0 {
					t.Fatalf("after the kill: %d rows, %d ids twice; want %d, none", got, doubled, wantBefore)
				}
				info, err := cons.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if info.NumAckPending == 0 {
					t.Fatalf("after the kill nothing is unacknowledged; want the killed batch pending (%+v)", info)
				}

				var handled atomic.Int32
				stop := consume(t, a, cons, func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
					handled.Add(1)
					return a.handle(ctx, tx, msg)
				})
				drained(t, cons, a, n)
				stop()
				if got, doubled := a.rows(t); got != n || doubled != 0 {
					t.Errorf("after the restart: %d rows, %d ids twice; want %d, none", got, doubled, n)
				}
				if h := int(handled.Load()); h != n-wantBefore {
					t.Errorf("the restarted consumer handled %d messages; want %d (the %d committed before the kill skipped)", h, n-wantBefore, wantBefore)
				}
			})
		}
	}
}

// child consumes like an application and stops dead at its kill point,
// announced on stdout, for the parent's SIGKILL.
func child(t *testing.T, mode string) {
	args := strings.Split(os.Getenv(envArgs), "|")
	dialect, _ := strconv.Atoi(args[0])
	killAt, _ := strconv.Atoi(args[7])
	a := openApp(t, sqldialect.Dialect(dialect), args[1], args[2], args[3], args[4])
	js := jsFor(t)
	ctx := context.Background()
	cons, err := js.Consumer(ctx, args[5], args[6])
	if err != nil {
		t.Fatal(err)
	}
	it, err := cons.Messages()
	if err != nil {
		t.Fatal(err)
	}
	handled := 0
	for {
		msg, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		m := &stallingMsg{Msg: msg}
		_, err = a.inbox.Process(ctx, m, func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
			if err := a.handle(ctx, tx, msg); err != nil {
				return err
			}
			if handled++; handled == killAt {
				if mode == "in-handler" {
					fmt.Printf("natsjs-child: inside the handler of message %d, before its commit\n", handled)
					select {} // killed here
				}
				m.stall = handled
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// stallingMsg is a message whose Ack, once stall is set, announces that
// its transaction has committed and waits to be killed.
type stallingMsg struct {
	jetstream.Msg
	stall int
}

func (m *stallingMsg) Ack() error {
	if m.stall > 0 {
		fmt.Printf("natsjs-child: message %d committed, before its ack\n", m.stall)
		select {} // killed here
	}
	return m.Msg.Ack()
}

// A message whose id cannot be had is terminated, never handled: no
// redelivery could handle it once.
func TestInboxNoID(t *testing.T) {
	js := jsFor(t)
	d := databases[0]
	a := appOn(t, d)
	a.inbox.ID = func(jetstream.Msg) (string, error) { return "", nil }
	stream, name := newStream(t, js)
	ctx := context.Background()
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "app", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, js, name+".x", 1)
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	handled := false
	ran, err := a.inbox.Process(ctx, msg, func(context.Context, *sql.Tx, jetstream.Msg) error { handled = true; return nil })
	if !errors.Is(err, natsjs.ErrNoID) || ran || handled {
		t.Fatalf("Process without an id = %v, %v (handled %v); want ErrNoID, not handled", ran, err, handled)
	}
	drained(t, cons, a, 0) // terminated: neither pending nor redelivered
	if n, _ := a.rows(t); n != 0 {
		t.Errorf("%d rows; want none", n)
	}
}
