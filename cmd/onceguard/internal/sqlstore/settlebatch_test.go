package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	idemsql "github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/sqldialect"
)

// Concurrent requests' settlements of paid withdrawals share statements
// (AsyncSettle with a key store that completes several records at once),
// and each answers as it would alone: moved and its record completed; a
// movement settled otherwise before answers its status, its record left
// alone; a record whose lease was lost leaves the settlement committed
// (ErrRecordLost); a movement two requests settle at once moves once and
// completes both records. The first settlements hold their four slots on
// rows the test keeps locked while the rest queue, so the queue is sent in
// batches: fewer write transactions than settlements.
func TestSettleBatched(t *testing.T) {
	d := databases[0]
	if d.dialect != sqldialect.Postgres {
		t.Fatal("databases[0] is not PostgreSQL")
	}
	s, db, now := withFunds(t, d)
	ctx := context.Background()
	keys, err := idemsql.New(db, sqldialect.Postgres, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Records, s.AsyncSettle = keys, true

	const n = 28 // w0..w27; w0..w3 hold the slots
	leases := map[string]string{}
	// The key store's table outlives the test's database reset: ids of this run only.
	run := fmt.Sprintf("batch%d-", time.Now().UnixNano())
	begin := func(rid string) {
		res, err := keys.Begin(ctx, idemstore.BeginRequest{ID: run + rid, Fingerprint: "f", Lease: time.Minute, TTL: time.Hour, Now: time.Now()})
		if err != nil || res.Outcome != idemstore.Started {
			t.Fatalf("Begin(%s) = %+v, %v", rid, res, err)
		}
		leases[rid] = res.Lease
	}
	for i := range n {
		id := fmt.Sprintf("w%d", i)
		if _, created, err := s.Withdraw(ctx, app.Movement{ID: id, UserID: "u1", Key: "k" + id, Amount: 100, CreatedAt: time.UnixMicro(now)}, 0, nil); err != nil || !created {
			t.Fatalf("Withdraw(%s) = %v, %v", id, created, err)
		}
		begin("r" + id)
	}
	begin("rw6b") // a second request settling w6
	// w4 was failed by a callback before; w5's record is another holder's now.
	if moved, err := s.SettleWithdrawal(ctx, "w4", false, time.UnixMicro(now)); err != nil || !moved {
		t.Fatalf("SettleWithdrawal(w4) = %v, %v", moved, err)
	}
	leases["rw5"] = "another lease"

	// Lock w0..w3 so that their settlements hold every slot until the rest queued.
	lockTx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lockTx.Rollback()
	if _, err := lockTx.ExecContext(ctx, `SELECT 1 FROM withdrawals WHERE id IN ('w0', 'w1', 'w2', 'w3') FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var xid0 int64
	if err := db.QueryRowContext(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&xid0); err != nil {
		t.Fatal(err)
	}

	type answer struct {
		moved  bool
		status app.Status
		err    error
	}
	var mu sync.Mutex
	answers := map[string][]answer{}
	var wg sync.WaitGroup
	settle := func(id, rid string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := []byte(`{"id":"` + id + `","rid":"` + rid + `"}`)
			rec := &app.Record{ID: run + rid, Lease: leases[rid], Answer: app.Answer{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: body}}
			moved, status, err := s.Settle(ctx, app.Withdrawal, id, app.Succeeded, time.UnixMicro(now), rec, "")
			mu.Lock()
			answers[id] = append(answers[id], answer{moved, status, err})
			mu.Unlock()
		}()
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after 10 s, still not: %s (%d queued, %d slots in use)", what, sqlstore.SettlesQueued(s), sqlstore.SettlesInflight(s))
			}
		}
	}
	for i := range 4 { // one at a time: each takes a slot and blocks on its locked row
		settle(fmt.Sprintf("w%d", i), fmt.Sprintf("rw%d", i))
		waitFor(fmt.Sprintf("w%d holds a slot", i), func() bool { return sqlstore.SettlesInflight(s) == i+1 && sqlstore.SettlesQueued(s) == 0 })
	}
	for i := 4; i < n; i++ {
		settle(fmt.Sprintf("w%d", i), fmt.Sprintf("rw%d", i))
	}
	settle("w6", "rw6b")
	waitFor("the rest queued", func() bool { return sqlstore.SettlesQueued(s) == n-4+1 })
	if err := lockTx.Commit(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	var xid1 int64
	if err := db.QueryRowContext(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&xid1); err != nil {
		t.Fatal(err)
	}
	// 4 statements for the slots' settlements, at most 4 for the queue, one for w6's second
	// request alone, and the lock's transaction: the queue's 25 did not take one each.
	if writes := xid1 - xid0; writes > 12 {
		t.Errorf("%d write transactions for %d settlements; want them batched (at most 12)", writes, n+1)
	}

	completed := func(rid string) bool {
		var state int
		var body []byte
		if err := db.QueryRowContext(ctx, `SELECT state, COALESCE(body, '') FROM onceguard_idempotency WHERE id = $1`, run+rid).Scan(&state, &body); err != nil {
			t.Fatalf("record %s: %v", rid, err)
		}
		return state == 2 && len(body) > 0
	}
	for i := range n {
		id, rid := fmt.Sprintf("w%d", i), fmt.Sprintf("rw%d", i)
		var status string
		if err := db.QueryRowContext(ctx, `SELECT status FROM withdrawals WHERE id = $1`, id).Scan(&status); err != nil {
			t.Fatal(err)
		}
		got := answers[id][0]
		switch id {
		case "w4": // settled otherwise before: its status, nothing moved, its record untouched
			if got.moved || got.status != app.Failed || got.err != nil || status != "failed" || completed(rid) {
				t.Errorf("%s settled before: answer %+v, status %s, record completed %v; want failed, not moved, record in flight", id, got, status, completed(rid))
			}
		case "w5": // its record's lease lost: settled all the same
			if !got.moved || got.status != app.Succeeded || !errors.Is(got.err, app.ErrRecordLost) || status != "succeeded" || completed(rid) {
				t.Errorf("%s with a lost lease: answer %+v, status %s, record completed %v; want moved, ErrRecordLost, record in flight", id, got, status, completed(rid))
			}
		case "w6": // two requests at once: one moved it, both records completed
			both := answers[id]
			if len(both) != 2 || both[0].moved == both[1].moved || both[0].err != nil || both[1].err != nil || status != "succeeded" || !completed("rw6") || !completed("rw6b") {
				t.Errorf("%s settled by two requests: answers %+v, status %s; want one moved, no error, both records completed", id, both, status)
			}
		default:
			if !got.moved || got.status != app.Succeeded || got.err != nil || status != "succeeded" || !completed(rid) {
				t.Errorf("%s: answer %+v, status %s, record completed %v; want moved, succeeded, completed", id, got, status, completed(rid))
			}
		}
	}
	var body string
	if err := db.QueryRowContext(ctx, `SELECT convert_from(body, 'UTF8') FROM onceguard_idempotency WHERE id = $1`, run+"rw9").Scan(&body); err != nil || body != `{"id":"w9","rid":"rw9"}` {
		t.Errorf("rw9's stored answer = %q, %v; want its own body", body, err)
	}
	var left int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pending_movements`).Scan(&left); err != nil || left != 0 {
		t.Errorf("%d movements left in the backlog, %v; want none", left, err)
	}
	var balance int64
	if err := db.QueryRowContext(ctx, `SELECT balance FROM accounts WHERE user_id = 'u1'`).Scan(&balance); err != nil || balance != 10000-int64(n-1)*100 {
		t.Errorf("balance %d, %v; want %d (w4 refunded)", balance, err, 10000-int64(n-1)*100)
	}
}
