package sqlstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/events"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/outbox"
	"github.com/onceguard/onceguard/sqldialect"
)

// The service's outbox migration creates exactly the table package outbox
// expects (outbox.Schema), so the library's queries run on it.
func TestOutboxMigrationIsTheLibrarys(t *testing.T) {
	for _, d := range []sqldialect.Dialect{sqldialect.Postgres, sqldialect.MySQL, sqldialect.SQLite} {
		want, err := outbox.Schema(d, events.Table)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, s := range sqlstore.MigrationStatements(d, 6) {
			var lines []string
			for _, l := range strings.Split(s, "\n") {
				if !strings.HasPrefix(strings.TrimSpace(l), "--") {
					lines = append(lines, l)
				}
			}
			got = append(got, strings.TrimSpace(strings.Join(lines, "\n")))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: migration 006 =\n%s\nwant outbox.Schema's\n%s", d, strings.Join(got, ";\n"), strings.Join(want, ";\n"))
		}
	}
}

// published collects what a relay publishes.
type published struct {
	mu   sync.Mutex
	msgs []outbox.Message
}

func (p *published) Publish(_ context.Context, m outbox.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, m)
	return nil
}

// Every settlement writes its event in its own transaction, once however
// many settle the movement at once (a request, callbacks, the
// reconciler); a paid order writes one; a settlement that changes nothing
// writes none; the events carry the resource as its GET answers it.
func TestSettleWritesOneEvent(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, db, now := withUserDB(t, d)
			ctx := context.Background()
			box, err := outbox.New(db, d.dialect, &outbox.Options{Table: events.Table})
			if err != nil {
				t.Fatal(err)
			}
			w := &events.Writer{Outbox: box}
			s.Events = w
			at := time.UnixMicro(now)
			if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: "dep_1", UserID: "u1", Key: "k1", Amount: 5000, CreatedAt: at}); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Go(func() {
					event := ""
					if i%2 == 1 {
						event = fmt.Sprintf("evt_psp_%d", i)
					}
					if _, _, err := s.Settle(ctx, app.Deposit, "dep_1", app.Succeeded, at, nil, event); err != nil {
						t.Errorf("Settle = %v", err)
					}
				})
			}
			wg.Wait()
			if _, _, err := s.Withdraw(ctx, app.Movement{ID: "wd_1", UserID: "u1", Key: "k2", Amount: 1000, CreatedAt: at}, 0, nil); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.Settle(ctx, app.Withdrawal, "wd_1", app.Failed, at, nil, ""); err != nil {
				t.Fatal(err)
			}
			if m, _, err := s.Settle(ctx, app.Withdrawal, "wd_1", app.Succeeded, at, nil, ""); err != nil || m {
				t.Fatalf("Settle of a settled withdrawal = %v, %v; want not moved", m, err)
			}
			if _, _, err := s.CreateOrder(ctx, app.Order{ID: "ord_1", OrderNo: "ON1", UserID: "u1", Key: "k3", Amount: 700, Description: "tea", CreatedAt: at}); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.PayOrder(ctx, app.Payment{ID: "pay_1", OrderID: "ord_1", UserID: "u1", Key: "k4", CreatedAt: at}, 0); err != nil {
				t.Fatal(err)
			}
			if _, _, err := s.PayOrder(ctx, app.Payment{ID: "pay_1b", OrderID: "ord_1", UserID: "u1", Key: "k4", CreatedAt: at}, 0); err != nil {
				t.Fatalf("PayOrder replay = %v", err)
			}
			pub := &published{}
			relay, err := outbox.NewRelay(box, pub, nil)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := relay.RunOnce(ctx); err != nil || n != 3 {
				t.Fatalf("RunOnce = %d, %v; want 3 events", n, err)
			}
			want := map[string]struct{ subject, status string }{
				"evt_dep_1_succeeded": {"onceguard.deposit.succeeded", "succeeded"},
				"evt_wd_1_failed":     {"onceguard.withdrawal.failed", "failed"},
				"evt_ord_1_paid":      {"onceguard.order.paid", "paid"},
			}
			for _, m := range pub.msgs {
				w, ok := want[m.ID]
				if !ok {
					t.Errorf("unexpected event %s", m.ID)
					continue
				}
				delete(want, m.ID)
				var e struct {
					ID, Type, CreatedAt, UserID string
					Data                        map[string]any
				}
				if err := json.Unmarshal(m.Payload, &e); err != nil {
					t.Fatal(err)
				}
				var raw map[string]any
				_ = json.Unmarshal(m.Payload, &raw)
				if m.Subject != w.subject || e.ID != m.ID || raw["type"] != strings.TrimPrefix(w.subject, "onceguard.") || raw["user_id"] != "u1" ||
					raw["created_at"] != at.UTC().Format(time.RFC3339) || e.Data["status"] != w.status || e.Data["id"] == nil || e.Data["amount"] == nil {
					t.Errorf("event %s on %s = %s; want type, user_id, created_at and the resource with status %s", m.ID, m.Subject, m.Payload, w.status)
				}
			}
			for id := range want {
				t.Errorf("no event %s", id)
			}
			if got := pub.msgs[len(pub.msgs)-1]; got.ID == "evt_ord_1_paid" {
				var raw struct{ Data map[string]any }
				_ = json.Unmarshal(got.Payload, &raw)
				if raw.Data["payment_id"] != "pay_1" || raw.Data["amount"] != "7.00" {
					t.Errorf("order event data = %v; want payment_id pay_1 and amount 7.00", raw.Data)
				}
			}
		})
	}
}

// Without Events, nothing is written to the outbox.
func TestNoEventsWithoutWriter(t *testing.T) {
	d := databases[2] // SQLite: the schema is the same everywhere
	s, db, now := withUserDB(t, d)
	ctx := context.Background()
	at := time.UnixMicro(now)
	if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: "dep_1", UserID: "u1", Key: "k1", Amount: 5000, CreatedAt: at}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Settle(ctx, app.Deposit, "dep_1", app.Succeeded, at, nil, ""); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM outbox`).Scan(&n); err != nil || n != 0 {
		t.Errorf("outbox rows = %d, %v; want 0", n, err)
	}
}
