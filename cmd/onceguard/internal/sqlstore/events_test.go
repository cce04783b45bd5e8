package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
)

// A settlement by provider callback records its event id in the
// settlement's transaction: 20 deliveries of one event at once, and 20
// other events agreeing, credit the deposit once; the same event again is
// ErrDuplicateEvent; an event contradicting the final status changes
// nothing and leaves no event row; the balance always equals the ledger.
func TestSettleEvents(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, db, now := withUserDB(t, d)
			ctx := context.Background()
			at := time.UnixMicro(now)
			if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: "d1", UserID: "u1", Key: "k1", Amount: 1000, CreatedAt: at}); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			moved, dup := 0, 0
			for i := range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					event := "evt_1"
					if i%2 == 1 {
						event = fmt.Sprintf("evt_other_%d", i)
					}
					m, st, err := s.Settle(ctx, app.Deposit, "d1", app.Succeeded, at, nil, event)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case errors.Is(err, app.ErrDuplicateEvent):
						dup++
					case err != nil:
						t.Errorf("Settle(%s) = %v", event, err)
					case st != app.Succeeded:
						t.Errorf("Settle(%s) status = %s; want succeeded", event, st)
					case m:
						moved++
					}
				}()
			}
			wg.Wait()
			if moved != 1 || dup != 19 {
				t.Errorf("moved %d times, %d duplicates; want 1 and 19", moved, dup)
			}
			if _, _, err := s.Settle(ctx, app.Deposit, "d1", app.Succeeded, at, nil, "evt_1"); !errors.Is(err, app.ErrDuplicateEvent) {
				t.Errorf("Settle(evt_1 again) = %v; want ErrDuplicateEvent", err)
			}
			m, st, err := s.Settle(ctx, app.Deposit, "d1", app.Failed, at, nil, "evt_stale")
			if err != nil || m || st != app.Succeeded {
				t.Errorf("Settle(a stale failure) = %v, %s, %v; want not moved, succeeded", m, st, err)
			}
			var n int
			if err := db.QueryRow(`SELECT count(*) FROM psp_events WHERE event_id = 'evt_stale'`).Scan(&n); err != nil || n != 0 {
				t.Errorf("rows of the contradicting event = %d, %v; want 0", n, err)
			}
			if err := db.QueryRow(`SELECT count(*) FROM psp_events`).Scan(&n); err != nil || n != 21 {
				t.Errorf("event rows = %d, %v; want 21", n, err)
			}
			if b, l, err := s.Balance(ctx, "u1"); err != nil || b != 1000 || l != 1000 {
				t.Errorf("balance %v, ledger %v, %v; want 10.00 both", b, l, err)
			}
			if _, _, err := s.Settle(ctx, app.Deposit, "nope", app.Succeeded, at, nil, "evt_nope"); !errors.Is(err, app.ErrNotFound) {
				t.Errorf("Settle(unknown movement) = %v; want ErrNotFound", err)
			}
			if got, err := s.FindMovement(ctx, "d1"); err != nil || got.Kind != app.Deposit || got.UserID != "u1" || got.Status != app.Succeeded {
				t.Errorf("FindMovement(d1) = %+v, %v", got, err)
			}
			if _, err := s.FindMovement(ctx, "nope"); !errors.Is(err, app.ErrNotFound) {
				t.Errorf("FindMovement(unknown) = %v; want ErrNotFound", err)
			}
		})
	}
}
