package sqlstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/events"
	"github.com/onceguard/onceguard/outbox"
)

// Contradicting callbacks (a failure and a success of one withdrawal) with duplicates of each,
// and a request's own settlement, all at once: one outcome wins, a refund at most once, one
// event in the outbox with the winning status, only agreeing psp events kept; no errors.
func TestContradictingCallbacksRace(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, db, now := withFunds(t, d)
			box, _ := outbox.New(db, d.dialect, &outbox.Options{Table: events.Table})
			s.Events = &events.Writer{Outbox: box}
			ctx := context.Background()
			at := time.UnixMicro(now)
			for i := range 15 {
				id := fmt.Sprintf("wd_%d", i)
				if _, _, err := s.Withdraw(ctx, app.Movement{ID: id, UserID: "u1", Key: "k" + id, Amount: 100, CreatedAt: at}, 0, nil); err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				for j := range 8 {
					wg.Go(func() {
						out, ev := app.Failed, fmt.Sprintf("evt_f_%d", i)
						if j%2 == 1 {
							out, ev = app.Succeeded, fmt.Sprintf("evt_s_%d", i)
						}
						if j == 7 {
							ev = ""
						}
						if _, _, err := s.Settle(ctx, app.Withdrawal, id, out, at, nil, ev); err != nil && err != app.ErrDuplicateEvent {
							t.Errorf("%s Settle(%s, %s) = %v", d.name, out, ev, err)
						}
					})
				}
				wg.Wait()
			}
			var bad int
			if err := db.QueryRow(`SELECT count(*) FROM psp_events e JOIN withdrawals w ON w.id = e.movement_id WHERE e.status <> w.status`).Scan(&bad); err != nil || bad != 0 {
				t.Errorf("psp events contradicting their withdrawal = %d, %v", bad, err)
			}
			for i := range 15 {
				var st string
				var n, match int
				id := fmt.Sprintf("wd_%d", i)
				if err := db.QueryRow(`SELECT status FROM withdrawals WHERE id = '` + id + `'`).Scan(&st); err != nil {
					t.Fatal(err)
				}
				if err := db.QueryRow(`SELECT count(*) FROM outbox WHERE id IN ('evt_` + id + `_succeeded', 'evt_` + id + `_failed')`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if err := db.QueryRow(`SELECT count(*) FROM outbox WHERE id = 'evt_` + id + `_` + st + `'`).Scan(&match); err != nil {
					t.Fatal(err)
				}
				if st == "pending" || n != 1 || match != 1 {
					t.Errorf("%s is %s with %d events (%d matching); want settled, one matching event", id, st, n, match)
				}
			}
			if b, l, err := s.Balance(ctx, "u1"); err != nil || b != l {
				t.Errorf("balance %v, ledger %v, %v", b, l, err)
			}
		})
	}
}
