package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

// racers is how many goroutines each race below starts at once.
const racers = 20

// race runs f(0..n-1) in n goroutines released together by a barrier
// (a channel closed once every goroutine is ready), so that the calls
// overlap, and waits for all of them.
func race(n int, f func(i int)) {
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			f(i)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
}

// sameKeyRace runs create in racers goroutines at once, all under one key,
// and tallies the answers: how many said they created the row, how many
// times each id came back, and the errors.
func sameKeyRace(create func(i int) (id string, created bool, err error)) (news int, ids map[string]int, bad []string) {
	var mu sync.Mutex
	ids = map[string]int{}
	race(racers, func(i int) {
		id, created, err := create(i)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			bad = append(bad, err.Error())
			return
		}
		ids[id]++
		if created {
			news++
		}
	})
	return news, ids, bad
}

// fund credits u1 with amount through a settled deposit.
func fund(t *testing.T, s *sqlstore.Store, id string, amount money.Amount, now int64) {
	t.Helper()
	ctx := context.Background()
	if _, created, err := s.CreateDeposit(ctx, app.Movement{ID: id, UserID: "u1", Key: "fund-" + id, Amount: amount, CreatedAt: time.UnixMicro(now)}); err != nil || !created {
		t.Fatalf("CreateDeposit(%s) = %v, %v", id, created, err)
	}
	if moved, err := s.SettleDeposit(ctx, id, true, time.UnixMicro(now)); err != nil || !moved {
		t.Fatalf("SettleDeposit(%s) = %v, %v", id, moved, err)
	}
}

// counter counts rows with a query of ? placeholders in d's dialect.
func counter(t *testing.T, db *sql.DB, d database) func(query string, args ...any) int {
	return func(query string, args ...any) int {
		t.Helper()
		if d.dialect == sqldialect.Postgres {
			query = sqldb.Rebind(query)
		}
		var n int
		if err := db.QueryRow(query, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", query, err)
		}
		return n
	}
}

// onEachDatabase runs f in a subtest per database, on a fresh schema
// with user u1 (withUserDB); count counts rows (counter).
func onEachDatabase(t *testing.T, f func(t *testing.T, s *sqlstore.Store, db *sql.DB, count func(query string, args ...any) int, now int64)) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, db, now := withUserDB(t, d)
			f(t, s, db, counter(t, db, d), now)
		})
	}
}

// wantBalance checks u1's balance and that the ledger sums to it.
func wantBalance(t *testing.T, s *sqlstore.Store, want money.Amount) {
	t.Helper()
	bal, sum, err := s.Balance(context.Background(), "u1")
	if err != nil || bal != want || sum != bal {
		t.Errorf("balance %v, ledger sum %v, %v; want %v and equal", bal, sum, err, want)
	}
}

// order creates u1's order id of amount.
func order(t *testing.T, s *sqlstore.Store, id string, amount money.Amount, now int64) {
	t.Helper()
	if _, created, err := s.CreateOrder(context.Background(), app.Order{ID: id, OrderNo: "N-" + id, UserID: "u1", Key: "ok-" + id, Amount: amount, CreatedAt: time.UnixMicro(now)}); err != nil || !created {
		t.Fatalf("CreateOrder(%s) = %v, %v", id, created, err)
	}
}

// 20 payments of one order at once, each under its own key, without a
// lock (fence 0): one goes through, the 19 others are ErrAlreadyPaid; one
// payment row, one debit of the order's amount, one ledger entry.
func TestPayOrderRace(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, s *sqlstore.Store, db *sql.DB, count func(string, ...any) int, now int64) {
		ctx := context.Background()
		fund(t, s, "d1", 10000, now)
		order(t, s, "o1", 2500, now)

		var mu sync.Mutex
		var won []string
		errs := map[string]int{}
		race(racers, func(i int) {
			p, created, err := s.PayOrder(ctx, app.Payment{ID: fmt.Sprintf("p%d", i), OrderID: "o1", UserID: "u1", Key: fmt.Sprintf("k%d", i), CreatedAt: time.UnixMicro(now)}, 0)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && created:
				won = append(won, p.ID)
			case errors.Is(err, app.ErrAlreadyPaid):
				errs["ErrAlreadyPaid"]++
			default:
				errs[fmt.Sprintf("created=%v err=%v", created, err)]++
			}
		})
		if len(won) != 1 || errs["ErrAlreadyPaid"] != racers-1 {
			t.Errorf("PayOrder x%d: succeeded %v, other outcomes %v; want one success and %d ErrAlreadyPaid", racers, won, errs, racers-1)
		}
		if n := count(`SELECT COUNT(*) FROM payments WHERE order_id = ?`, "o1"); n != 1 {
			t.Errorf("payment rows = %d; want 1", n)
		}
		if n := count(`SELECT COUNT(*) FROM ledger WHERE user_id = ? AND kind = 'payment'`, "u1"); n != 1 {
			t.Errorf("payment ledger entries = %d; want 1", n)
		}
		if len(won) == 1 {
			if n := count(`SELECT COUNT(*) FROM payments WHERE id = ? AND paid_order_id = ? AND amount = 2500 AND status = 'succeeded'`, won[0], "o1"); n != 1 {
				t.Errorf("the winner's payment %s is not the succeeded one of o1 for 25.00", won[0])
			}
		}
		if o, err := s.OrderByID(ctx, "u1", "o1"); err != nil || o.Status != "paid" {
			t.Errorf("order = %+v, %v; want paid", o, err)
		}
		wantBalance(t, s, 7500)
	})
}

// The same key for the same order returns the first payment (its id,
// created false) and debits nothing more: one after the other, then 20 at
// once under a new order's key.
func TestPayOrderSameKey(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, s *sqlstore.Store, db *sql.DB, count func(string, ...any) int, now int64) {
		ctx := context.Background()
		fund(t, s, "d1", 10000, now)
		order(t, s, "o1", 2500, now)
		first, created, err := s.PayOrder(ctx, app.Payment{ID: "p1", OrderID: "o1", UserID: "u1", Key: "k", CreatedAt: time.UnixMicro(now)}, 0)
		if err != nil || !created || first.ID != "p1" {
			t.Fatalf("PayOrder = %+v, %v, %v; want p1 created", first, created, err)
		}
		again, created, err := s.PayOrder(ctx, app.Payment{ID: "p2", OrderID: "o1", UserID: "u1", Key: "k", CreatedAt: time.UnixMicro(now)}, 0)
		if err != nil || created || again.ID != "p1" || again.Amount != 2500 || again.Status != "succeeded" {
			t.Errorf("PayOrder(same key) = %+v, %v, %v; want p1 back, not created", again, created, err)
		}
		wantBalance(t, s, 7500)

		order(t, s, "o2", 1000, now)
		news, ids, bad := sameKeyRace(func(i int) (string, bool, error) {
			p, created, err := s.PayOrder(ctx, app.Payment{ID: fmt.Sprintf("q%d", i), OrderID: "o2", UserID: "u1", Key: "k2", CreatedAt: time.UnixMicro(now)}, 0)
			return p.ID, created, err
		})
		if len(bad) != 0 || news != 1 || len(ids) != 1 {
			t.Errorf("PayOrder(one key) x%d: %d created, ids %v, errors %q; want one created, one id, no error", racers, news, ids, bad)
		}
		if n := count(`SELECT COUNT(*) FROM payments WHERE user_id = ?`, "u1"); n != 2 {
			t.Errorf("payment rows = %d; want 2", n)
		}
		wantBalance(t, s, 6500)
	})
}

// A payment the balance does not cover is ErrInsufficientFunds and writes
// nothing: no payment, no debit, no ledger entry, the order still open;
// the same key succeeds once the money is there.
func TestPayOrderInsufficientFunds(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, s *sqlstore.Store, db *sql.DB, count func(string, ...any) int, now int64) {
		ctx := context.Background()
		fund(t, s, "d1", 2499, now)
		order(t, s, "o1", 2500, now)
		ledger := count(`SELECT COUNT(*) FROM ledger`)
		if p, created, err := s.PayOrder(ctx, app.Payment{ID: "p1", OrderID: "o1", UserID: "u1", Key: "k", CreatedAt: time.UnixMicro(now)}, 0); !errors.Is(err, app.ErrInsufficientFunds) || created {
			t.Errorf("PayOrder(short) = %+v, %v, %v; want ErrInsufficientFunds", p, created, err)
		}
		if n := count(`SELECT COUNT(*) FROM payments`); n != 0 {
			t.Errorf("payment rows = %d; want none", n)
		}
		if n := count(`SELECT COUNT(*) FROM ledger`); n != ledger {
			t.Errorf("ledger entries = %d; want %d", n, ledger)
		}
		if o, err := s.OrderByID(ctx, "u1", "o1"); err != nil || o.Status != "created" {
			t.Errorf("order = %+v, %v; want created", o, err)
		}
		wantBalance(t, s, 2499)

		fund(t, s, "d2", 1, now)
		if p, created, err := s.PayOrder(ctx, app.Payment{ID: "p2", OrderID: "o1", UserID: "u1", Key: "k", CreatedAt: time.UnixMicro(now)}, 0); err != nil || !created || p.ID != "p2" {
			t.Errorf("PayOrder(funded, same key) = %+v, %v, %v; want p2 created", p, created, err)
		}
		wantBalance(t, s, 0)
	})
}

// A payment with a fence older than the one the order recorded (a newer
// holder of the order's lock wrote since) is ErrStaleFence and writes
// nothing; the current holder's fence then pays. Only a payment records a
// fence on an order, so the newer holder's fence is set here directly.
func TestPayOrderStaleFence(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, s *sqlstore.Store, db *sql.DB, count func(string, ...any) int, now int64) {
		ctx := context.Background()
		fund(t, s, "d1", 10000, now)
		order(t, s, "o1", 2500, now)
		ledger := count(`SELECT COUNT(*) FROM ledger`)
		q := `UPDATE orders SET fence = 7 WHERE id = 'o1'`
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
		if p, created, err := s.PayOrder(ctx, app.Payment{ID: "p1", OrderID: "o1", UserID: "u1", Key: "k1", CreatedAt: time.UnixMicro(now)}, 6); !errors.Is(err, app.ErrStaleFence) || created {
			t.Errorf("PayOrder(fence 6 < 7) = %+v, %v, %v; want ErrStaleFence", p, created, err)
		}
		if n := count(`SELECT COUNT(*) FROM payments`); n != 0 {
			t.Errorf("payment rows = %d; want none", n)
		}
		if n := count(`SELECT COUNT(*) FROM ledger`); n != ledger {
			t.Errorf("ledger entries = %d; want %d", n, ledger)
		}
		if n := count(`SELECT COUNT(*) FROM orders WHERE id = 'o1' AND status = 'created' AND fence = 7`); n != 1 {
			t.Errorf("the order changed: want created, fence 7")
		}
		wantBalance(t, s, 10000)

		if p, created, err := s.PayOrder(ctx, app.Payment{ID: "p2", OrderID: "o1", UserID: "u1", Key: "k2", CreatedAt: time.UnixMicro(now)}, 7); err != nil || !created {
			t.Errorf("PayOrder(current fence 7) = %+v, %v, %v; want created", p, created, err)
		}
		wantBalance(t, s, 7500)
	})
}

// 20 withdrawals at once under one (user, key), each with its own id:
// one is created, the 19 others return its id with no error (the key's
// unique violation, or on PostgreSQL a debit that no longer fits, maps to
// the existing row), one row, one debit. With a balance of many amounts
// and one of exactly one amount (on PostgreSQL the losers then find no
// debit, not a duplicate).
func TestWithdrawSameKeyRace(t *testing.T) {
	for _, d := range databases {
		for _, funds := range []money.Amount{100000, 1000} {
			t.Run(fmt.Sprintf("%s/balance_%d", d.name, funds), func(t *testing.T) {
				s, db, now := withUserDB(t, d)
				ctx := context.Background()
				count := counter(t, db, d)
				fund(t, s, "d1", funds, now)
				news, ids, bad := sameKeyRace(func(i int) (string, bool, error) {
					m, created, err := s.Withdraw(ctx, app.Movement{ID: fmt.Sprintf("w%d", i), UserID: "u1", Key: "k", Amount: 1000, CreatedAt: time.UnixMicro(now)}, 0, nil)
					return m.ID, created, err
				})
				if len(bad) != 0 || news != 1 || len(ids) != 1 {
					t.Errorf("Withdraw(one key) x%d: %d created, ids %v, errors %q; want one created, one id for all, no error", racers, news, ids, bad)
				}
				if n := count(`SELECT COUNT(*) FROM withdrawals WHERE user_id = ?`, "u1"); n != 1 {
					t.Errorf("withdrawal rows = %d; want 1", n)
				}
				if n := count(`SELECT COUNT(*) FROM ledger WHERE kind = 'withdrawal'`); n != 1 {
					t.Errorf("withdrawal ledger entries = %d; want 1", n)
				}
				wantBalance(t, s, funds-1000)
			})
		}
	}
}

// 20 deposits at once under one (user, key): one is created, the others
// return its id with no error; one row, and no money before settlement.
// Then 20 settlements of it at once: one moves it, one credit.
func TestCreateDepositSameKeyRace(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, s *sqlstore.Store, db *sql.DB, count func(string, ...any) int, now int64) {
		ctx := context.Background()
		news, ids, bad := sameKeyRace(func(i int) (string, bool, error) {
			m, created, err := s.CreateDeposit(ctx, app.Movement{ID: fmt.Sprintf("d%d", i), UserID: "u1", Key: "k", Amount: 1000, CreatedAt: time.UnixMicro(now)})
			return m.ID, created, err
		})
		if len(bad) != 0 || news != 1 || len(ids) != 1 {
			t.Fatalf("CreateDeposit(one key) x%d: %d created, ids %v, errors %q; want one created, one id for all, no error", racers, news, ids, bad)
		}
		if n := count(`SELECT COUNT(*) FROM deposits WHERE user_id = ? AND status = 'pending'`, "u1"); n != 1 {
			t.Errorf("pending deposit rows = %d; want 1", n)
		}
		wantBalance(t, s, 0) // pending: no money yet

		var id string
		for k := range ids {
			id = k
		}
		var (
			mu    sync.Mutex
			moves int
		)
		race(racers, func(int) {
			moved, err := s.SettleDeposit(ctx, id, true, time.UnixMicro(now))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				bad = append(bad, err.Error())
			}
			if moved {
				moves++
			}
		})
		if len(bad) != 0 || moves != 1 {
			t.Errorf("SettleDeposit x%d: %d moved, errors %q; want one, no error", racers, moves, bad)
		}
		if n := count(`SELECT COUNT(*) FROM ledger WHERE kind = 'deposit'`); n != 1 {
			t.Errorf("deposit ledger entries = %d; want 1", n)
		}
		wantBalance(t, s, 1000)
	})
}

// The same races when the money is short: the first insert of the key
// rolls back (ErrInsufficientFunds) while the others wait on its unique
// entry; every call must then be ErrInsufficientFunds, nothing written,
// never a deadlock surfaced to the caller.
func TestShortFundsSameKeyRace(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, s *sqlstore.Store, db *sql.DB, count func(string, ...any) int, now int64) {
		ctx := context.Background()
		fund(t, s, "d1", 999, now)
		order(t, s, "o1", 1000, now)
		for _, op := range []struct {
			name string
			call func(i int) error
		}{
			{"Withdraw(one key)", func(i int) error {
				_, _, err := s.Withdraw(ctx, app.Movement{ID: fmt.Sprintf("w%d", i), UserID: "u1", Key: "k", Amount: 1000, CreatedAt: time.UnixMicro(now)}, 0, nil)
				return err
			}},
			{"PayOrder(one key)", func(i int) error {
				_, _, err := s.PayOrder(ctx, app.Payment{ID: fmt.Sprintf("p%d", i), OrderID: "o1", UserID: "u1", Key: "k", CreatedAt: time.UnixMicro(now)}, 0)
				return err
			}},
			{"PayOrder(own keys)", func(i int) error {
				_, _, err := s.PayOrder(ctx, app.Payment{ID: fmt.Sprintf("q%d", i), OrderID: "o1", UserID: "u1", Key: fmt.Sprintf("k%d", i), CreatedAt: time.UnixMicro(now)}, 0)
				return err
			}},
		} {
			var mu sync.Mutex
			others := map[string]int{}
			race(racers, func(i int) {
				err := op.call(i)
				if !errors.Is(err, app.ErrInsufficientFunds) {
					mu.Lock()
					others[fmt.Sprint(err)]++
					mu.Unlock()
				}
			})
			if len(others) != 0 {
				t.Errorf("%s x%d with funds short: outcomes other than ErrInsufficientFunds: %v", op.name, racers, others)
			}
		}
		if n := count(`SELECT COUNT(*) FROM withdrawals`) + count(`SELECT COUNT(*) FROM payments`); n != 0 {
			t.Errorf("withdrawal and payment rows = %d; want none", n)
		}
		wantBalance(t, s, 999)
	})
}

// Idempotency keys are compared byte for byte on every database: keys that
// differ only in case are two requests, each with its movement. (MySQL's
// default collations ignore case; before migration 004 the second key's
// deposit, withdrawal and order were answered with the first's.)
func TestKeysCaseSensitive(t *testing.T) {
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) {
			s, _, now := withUserDB(t, d)
			ctx := context.Background()
			fund(t, s, "d0", 10000, now)
			order(t, s, "o1", 100, now)
			for i, key := range []string{"CaseKey", "casekey", "CASEKEY"} {
				n := fmt.Sprint(i)
				if m, created, err := s.CreateDeposit(ctx, app.Movement{ID: "dk" + n, UserID: "u1", Key: key, Amount: 100, CreatedAt: time.UnixMicro(now)}); err != nil || !created || m.ID != "dk"+n {
					t.Errorf("CreateDeposit(%q) = %s, %v, %v; want a new deposit dk%s", key, m.ID, created, err, n)
				}
				if m, created, err := s.Withdraw(ctx, app.Movement{ID: "w" + n, UserID: "u1", Key: key, Amount: 100, CreatedAt: time.UnixMicro(now)}, 0, nil); err != nil || !created || m.ID != "w"+n {
					t.Errorf("Withdraw(%q) = %s, %v, %v; want a new withdrawal w%s", key, m.ID, created, err, n)
				}
				if o, created, err := s.CreateOrder(ctx, app.Order{ID: "o-" + n, OrderNo: "N" + n, UserID: "u1", Key: key, Amount: 100, CreatedAt: time.UnixMicro(now)}); err != nil || !created || o.ID != "o-"+n {
					t.Errorf("CreateOrder(%q) = %s, %v, %v; want a new order o-%s", key, o.ID, created, err, n)
				}
			}
			// Payment keys are scoped to the order: o1 paid under one key, a
			// key of another case is another payment attempt, refused as
			// already paid (not the first payment replayed).
			if _, created, err := s.PayOrder(ctx, app.Payment{ID: "p1", OrderID: "o1", UserID: "u1", Key: "PayKey", CreatedAt: time.UnixMicro(now)}, 0); err != nil || !created {
				t.Fatalf("PayOrder(PayKey) = %v, %v", created, err)
			}
			if p, _, err := s.PayOrder(ctx, app.Payment{ID: "p2", OrderID: "o1", UserID: "u1", Key: "paykey", CreatedAt: time.UnixMicro(now)}, 0); !errors.Is(err, app.ErrAlreadyPaid) {
				t.Errorf("PayOrder(paykey) = %s, %v; want ErrAlreadyPaid", p.ID, err)
			}
		})
	}
}
