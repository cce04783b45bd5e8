package app_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
)

// records completes a key's record by counting it, or refuses it.
type records struct {
	sqlstore.RecordCompleter // only CompleteTx is used
	refuse                   bool
	completed                []string
}

func (r *records) CompleteTx(_ context.Context, _ *sql.Tx, id, _ string, resp idemstore.Response) error {
	if r.refuse {
		return idempotency.ErrLeaseLost
	}
	r.completed = append(r.completed, id+" "+string(resp.Body))
	return nil
}

// withFundedAlice is withAlice with 50.00 deposited and settled.
func withFundedAlice(t *testing.T) *sqlstore.Store {
	t.Helper()
	s, _, now := withAlice(t)
	ctx := context.Background()
	if _, _, err := s.CreateDeposit(ctx, app.Movement{ID: "d1", UserID: "u1", Key: "kd", Amount: 5000, CreatedAt: time.UnixMicro(now)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SettleDeposit(ctx, "d1", true, time.UnixMicro(now)); err != nil {
		t.Fatal(err)
	}
	return s
}

// statusRecord is the key's record "rec", whose answer is the movement's
// status, counting in *completed the times it is told it completed.
func statusRecord(completed *int) *app.KeyRecord {
	return &app.KeyRecord{
		ID: "rec", Lease: "l",
		Answer:    func(m app.Movement) app.Answer { return app.Answer{Status: 201, Body: []byte(string(m.Status))} },
		Completed: func() { *completed++ },
	}
}

// A withdrawal settles through the one path: the key's record completes in
// the settlement's transaction with the answer for the settled movement,
// Completed is told, and one audit line is written. A record that cannot
// be completed (its lease lost) does not stop the settlement, which then
// commits alone, and Completed is not told.
func TestWithdrawSettlesWithItsRecord(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		s := withFundedAlice(t)
		ctx := context.Background()
		recs := &records{refuse: refuse}
		s.Records = recs
		var logs bytes.Buffer
		svc := app.New(app.Config{Store: s, Provider: psp.Port(&psp.Sim{}), Currency: "CNY", MaxAmount: 1_000_00,
			Locks: lock.New(&memlock.Backend{}, &lock.Options{AutoRenew: true}), Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
		completed := 0
		m, err := svc.Withdraw(ctx, app.MoveRequest{UserID: "u1", Key: "kw", Amount: 1000, Record: statusRecord(&completed)})
		if err != nil || m.Status != app.Succeeded {
			t.Fatalf("refuse %v: Withdraw = %+v, %v; want succeeded", refuse, m, err)
		}
		wantRecs, wantCompleted := "rec succeeded", 1
		if refuse {
			wantRecs, wantCompleted = "", 0
		}
		if got := strings.Join(recs.completed, ","); got != wantRecs || completed != wantCompleted {
			t.Errorf("refuse %v: records %q, Completed told %d times; want %q, %d", refuse, got, completed, wantRecs, wantCompleted)
		}
		if n := strings.Count(logs.String(), `"msg":"money"`); n != 1 {
			t.Errorf("refuse %v: %d audit lines; want 1", refuse, n)
		}
		if bal, sum, err := s.Balance(ctx, "u1"); err != nil || bal != 4000 || sum != bal {
			t.Errorf("refuse %v: balance %v, ledger %v, %v; want 40.00", refuse, bal, sum, err)
		}
	}
}

// The service's errors carry the codes the HTTP layer maps: a withdrawal
// over the balance is insufficient_funds, a key reused for another amount
// idempotency_key_reused, and neither moves money.
func TestWithdrawErrors(t *testing.T) {
	s, _, _ := withAlice(t)
	ctx := context.Background()
	svc := app.New(app.Config{Store: s, Provider: psp.Port(&psp.Sim{}), Currency: "CNY", MaxAmount: 1_000_00,
		Locks: lock.New(&memlock.Backend{}, &lock.Options{AutoRenew: true})})
	if _, err := svc.Withdraw(ctx, app.MoveRequest{UserID: "u1", Key: "k", Amount: 100}); app.ErrorCode(err) != app.CodeInsufficientFunds {
		t.Errorf("Withdraw over the balance = %v; want code %s", err, app.CodeInsufficientFunds)
	}
	if _, err := svc.Deposit(ctx, app.MoveRequest{UserID: "u1", Key: "d", Amount: 500}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Withdraw(ctx, app.MoveRequest{UserID: "u1", Key: "w", Amount: 100}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Withdraw(ctx, app.MoveRequest{UserID: "u1", Key: "w", Amount: 200}); !errors.Is(err, app.ErrKeyReused) {
		t.Errorf("Withdraw under a used key with another amount = %v; want ErrKeyReused", err)
	}
	if err := svc.CheckAmount(1_000_01); app.ErrorCode(err) != app.CodeInvalidAmount {
		t.Errorf("CheckAmount over the maximum = %v; want code %s", err, app.CodeInvalidAmount)
	}
	if bal, _, _ := s.Balance(ctx, "u1"); bal != 400 {
		t.Errorf("balance %v; want 4.00", bal)
	}
}

// contradicting is a provider whose answer contradicts the callback that
// settled the payout first: it fails the withdrawal in the store, as its
// callback would, then answers succeeded.
type contradicting struct{ s *sqlstore.Store }

func (c contradicting) Pay(ctx context.Context, _ app.Kind, key string, _ money.Amount) (app.Status, error) {
	if _, err := c.s.SettleWithdrawal(ctx, key, false, time.Now()); err != nil {
		return "", err
	}
	return app.Succeeded, nil
}

func (contradicting) Lookup(context.Context, string) (app.Status, error) { return app.Failed, nil }

// A withdrawal whose provider answers succeeded after its callback failed
// it is answered failed, and its key's record says failed too: the
// settlement committed first is the movement, its refund made once.
func TestWithdrawContradictedByItsCallback(t *testing.T) {
	s := withFundedAlice(t)
	ctx := context.Background()
	recs := &records{}
	s.Records = recs
	svc := app.New(app.Config{Store: s, Provider: contradicting{s}, Currency: "CNY", MaxAmount: 1_000_00,
		Locks: lock.New(&memlock.Backend{}, nil)})
	completed := 0
	m, err := svc.Withdraw(ctx, app.MoveRequest{UserID: "u1", Key: "kw", Amount: 1000, Record: statusRecord(&completed)})
	if err != nil || m.Status != app.Failed {
		t.Fatalf("Withdraw = %+v, %v; want failed, as its callback settled it", m, err)
	}
	if got := strings.Join(recs.completed, ","); got != "rec failed" || completed != 1 {
		t.Errorf("records %q, Completed told %d times; want %q, 1", got, completed, "rec failed")
	}
	if bal, sum, err := s.Balance(ctx, "u1"); err != nil || bal != 5000 || sum != bal {
		t.Errorf("balance %v, ledger %v, %v; want 50.00 (refunded once)", bal, sum, err)
	}
}

// payFunc is a provider whose Pay is a function; Lookup knows nothing.
type payFunc func(app.Kind, string) (app.Status, error)

func (f payFunc) Pay(_ context.Context, kind app.Kind, key string, _ money.Amount) (app.Status, error) {
	return f(kind, key)
}

func (f payFunc) Lookup(context.Context, string) (app.Status, error) { return "", app.ErrNoOperation }

// A withdrawal made before this request (its key taken over after a crash,
// or its settlement lost with PostgreSQL's asynchronous commit) may have
// been answered settled already: when the provider's outcome is unknown
// now, its pending answer is told Transient, so that the key does not keep
// it. A new withdrawal's pending answer, and a re-run the provider
// answers, are kept.
func TestRerunWithUnknownOutcomeIsTransient(t *testing.T) {
	s := withFundedAlice(t)
	ctx := context.Background()
	s.Records = &records{}
	unknown := true
	provider := payFunc(func(app.Kind, string) (app.Status, error) {
		if unknown {
			return "", app.ErrUnknownOutcome
		}
		return app.Succeeded, nil
	})
	svc := app.New(app.Config{Store: s, Provider: provider, Currency: "CNY", MaxAmount: 1_000_00,
		Locks: lock.New(&memlock.Backend{}, nil), Logger: slog.New(slog.DiscardHandler)})
	withdraw := func(key string) (app.Movement, int) {
		t.Helper()
		transient, completed := 0, 0
		rec := statusRecord(&completed)
		rec.Transient = func() { transient++ }
		m, err := svc.Withdraw(ctx, app.MoveRequest{UserID: "u1", Key: key, Amount: 1000, Record: rec})
		if err != nil {
			t.Fatalf("Withdraw(%s) = %v", key, err)
		}
		return m, transient
	}
	if m, transient := withdraw("k1"); m.Status != app.Pending || transient != 0 {
		t.Errorf("a new withdrawal, outcome unknown: %s, Transient told %d times; want pending, kept", m.Status, transient)
	}
	if m, transient := withdraw("k1"); m.Status != app.Pending || transient != 1 {
		t.Errorf("its re-run, outcome unknown: %s, Transient told %d times; want pending, transient", m.Status, transient)
	}
	unknown = false
	if m, transient := withdraw("k1"); m.Status != app.Succeeded || transient != 0 {
		t.Errorf("its re-run, paid: %s, Transient told %d times; want succeeded, kept", m.Status, transient)
	}
	if bal, sum, err := s.Balance(ctx, "u1"); err != nil || bal != 4000 || sum != bal {
		t.Errorf("balance %v, ledger %v, %v; want 40.00 (one withdrawal)", bal, sum, err)
	}
}
