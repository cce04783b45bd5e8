package app

import (
	"context"
	"errors"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// MoveRequest asks for a deposit or a withdrawal.
type MoveRequest struct {
	UserID string
	Key    string // the request's Idempotency-Key: one movement per (user, key)
	Amount money.Amount
	// Record, if set, is completed in the settlement's transaction.
	Record *KeyRecord
	// SessionHash, if not "", is the session the request came under: a withdrawal checks it
	// is still live in the transaction that debits (TxChecks).
	SessionHash string
}

// KeyRecord is the request's Idempotency-Key record and how to complete it.
type KeyRecord struct {
	ID, Lease string
	// Answer is the answer to store for the settled movement.
	Answer func(Movement) Answer
	// Completed is told when the record committed with the settlement.
	Completed func()
	// Start, if not nil, is the record still to create, in the withdrawal's transaction
	// (idempotency.Options.Deferred); Created is told once that transaction committed.
	Start   any // see TxChecks.Start
	Created func()
	// Transient, if set, makes the request's answer one the key does not keep
	// (idempotency.Call.Forget): told when a movement made before this request is
	// still pending because the provider's outcome is unknown (see pay).
	Transient func()
}

// CheckAmount refuses an amount not above 0 or above the service's maximum (CodeInvalidAmount).
func (s *Service) CheckAmount(a money.Amount) error {
	if a <= 0 || a > s.cfg.MaxAmount {
		return Errorf(CodeInvalidAmount, "a string or number like \"10.00\", more than 0 and at most %s", s.cfg.MaxAmount)
	}
	return nil
}

// Deposit records a deposit, charges it and settles it as the provider answers; an unknown
// outcome leaves it pending for the reconciler. Refused before the charge when its credit would
// take the balance past MaxBalance (ErrBalanceLimit); ErrKeyReused when the key made another.
func (s *Service) Deposit(ctx context.Context, req MoveRequest) (Movement, error) {
	acct, err := s.cfg.Store.Account(ctx, req.UserID)
	if err != nil {
		return Movement{}, err
	}
	if acct.Balance > MaxBalance-req.Amount {
		return Movement{}, ErrBalanceLimit
	}
	m, created, err := s.cfg.Store.CreateDeposit(ctx, Movement{ID: newID("dep_"), Kind: Deposit, UserID: req.UserID, Key: req.Key, Amount: req.Amount, CreatedAt: time.Now()})
	if err != nil {
		return Movement{}, err
	}
	if !created && m.Amount != req.Amount {
		return Movement{}, ErrKeyReused
	}
	return s.pay(ctx, m, created, req.Record)
}

// Withdraw debits a withdrawal under the user's lock, whose fence the account checks, pays it
// out and settles it as the provider answers (a failure refunds it); an unknown outcome leaves
// it pending for the reconciler. Errors: ErrInsufficientFunds, ErrKeyReused, and CodeBusy when
// the lock could not be had or kept.
func (s *Service) Withdraw(ctx context.Context, req MoveRequest) (Movement, error) {
	var (
		m       Movement
		created bool
	)
	var chk *TxChecks
	if req.SessionHash != "" || (req.Record != nil && req.Record.Start != nil) {
		chk = &TxChecks{SessionHash: req.SessionHash}
		if req.Record != nil {
			chk.Start = req.Record.Start
		}
	}
	err := s.underLock(ctx, userLock(req.UserID), true, func(fence int64) (err error) {
		m, created, err = s.cfg.Store.Withdraw(ctx, Movement{ID: newID("wd_"), Kind: Withdrawal, UserID: req.UserID, Key: req.Key, Amount: req.Amount, CreatedAt: time.Now()}, fence, chk)
		if chk != nil && chk.Start != nil && req.Record.Created != nil && !notStarted(err) {
			// The record committed (with the debit, or alone with a refusal such as
			// insufficient funds), or perhaps did (the database went away): its answer is
			// the record's now, kept or freed.
			req.Record.Created()
		}
		return err
	})
	switch {
	case errors.Is(err, errLock), errors.Is(err, ErrStaleFence):
		s.audit(ctx, string(Withdrawal), "", req.UserID, req.Key, req.Amount, OutcomeBusy, "")
		return Movement{}, busy(err)
	case errors.Is(err, ErrInsufficientFunds):
		s.audit(ctx, string(Withdrawal), "", req.UserID, req.Key, req.Amount, OutcomeInsufficientFunds, "")
		return Movement{}, &Error{Code: CodeInsufficientFunds, Message: "the balance does not cover this withdrawal; nothing changed"}
	case err != nil:
		return Movement{}, err
	}
	if !created && m.Amount != req.Amount {
		return Movement{}, ErrKeyReused
	}
	return s.pay(ctx, m, created, req.Record)
}

// notStarted reports an error of a withdrawal's transaction that created no key's record: the
// session ended, or the key's store refused the record (taken, window held, token refused).
func notStarted(err error) bool {
	var refused *StartRefusedError
	return errors.Is(err, ErrSessionEnded) || errors.As(err, &refused)
}

// busy is CodeBusy for a resource whose lock could not be had, or was lost before the write.
func busy(cause error) error {
	return &Error{Code: CodeBusy, Message: "the account or order is busy; nothing changed, retry shortly", Err: cause}
}

// pay sends a pending movement to the provider under its own id and settles it as it answers;
// one found settled is answered as it is, and one the provider settles later (Pending: its
// callback or the reconciler settles it) is answered pending. A movement made before this
// request (created false: its key taken over after a crash, or its settlement lost with
// PostgreSQL's asynchronous commit, sqlstore.Store.AsyncSettle) may have been answered settled
// already; when the provider's outcome is unknown now, its pending answer is Transient.
func (s *Service) pay(ctx context.Context, m Movement, created bool, rec *KeyRecord) (Movement, error) {
	if m.Status == Pending {
		st, err := s.cfg.Provider.Pay(ctx, m.Kind, m.ID, m.Amount)
		if err != nil && !created && rec != nil && rec.Transient != nil {
			rec.Transient()
		}
		if err == nil && st != Pending {
			settled := m
			settled.Status = st
			// Recorded even when the request's deadline has passed, but within a quarter
			// of it more: still inside the key's lease.
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RequestTimeout/4)
			defer cancel()
			_, status, err := s.settle(sctx, settled, rec, "", "")
			if err != nil {
				// Whether it committed is unknown: the caller answers an error, not a pending
				// movement a replay may contradict.
				return Movement{}, err
			}
			// Moved, or settled meanwhile by the reconciler or a callback: as that settled it,
			// also when the provider's answer here contradicts it (the record says the same).
			settled.Status = status
			return settled, nil
		}
	}
	s.audit(ctx, string(m.Kind), m.ID, m.UserID, m.Key, m.Amount, Outcome(m.Status), "")
	return m, nil
}

// settle is the one settlement path, of requests, provider callbacks and the reconciler: m (its
// final Status set) is settled, rec completed with it when given (alone if that fails: its lease
// was lost, say), event (a callback's id, "" for none) recorded with it, and the audit line
// written when this call moved it; by names the settler if not a request. status is the
// movement's status after: another than m.Status when it was settled otherwise before.
func (s *Service) settle(ctx context.Context, m Movement, rec *KeyRecord, by, event string) (moved bool, status Status, err error) {
	now := time.Now()
	err = errors.New("app: no record")
	if rec != nil {
		r := &Record{ID: rec.ID, Lease: rec.Lease, Answer: rec.Answer(m)}
		moved, status, err = s.cfg.Store.Settle(ctx, m.Kind, m.ID, m.Status, now, r, event)
		if err == nil && status != m.Status {
			// Settled otherwise before (a callback the provider contradicts here): nothing
			// committed, and the record answers the movement as it is.
			s.logger(ctx).Error("provider answer contradicts the movement", "kind", string(m.Kind), "id", m.ID,
				"provider_status", string(m.Status), "movement_status", string(status))
			as := m
			as.Status = status
			r.Answer = rec.Answer(as)
			_, status, err = s.cfg.Store.Settle(ctx, m.Kind, m.ID, status, now, r, "")
		}
		if err == nil && rec.Completed != nil {
			rec.Completed()
		}
		if errors.Is(err, ErrRecordLost) { // settled all the same, the record left to its new holder
			err = nil
		}
	}
	if err != nil {
		moved, status, err = s.cfg.Store.Settle(ctx, m.Kind, m.ID, m.Status, now, nil, event)
	}
	if err != nil || !moved {
		return false, status, err
	}
	s.audit(ctx, string(m.Kind), m.ID, m.UserID, m.Key, m.Amount, Outcome(m.Status), by)
	return true, status, nil
}

// Movements returns a user's movements of kind, newest first, at most limit.
func (s *Service) Movements(ctx context.Context, kind Kind, userID string, limit int) ([]Movement, error) {
	return s.cfg.Store.Movements(ctx, kind, userID, limit)
}

// Movement returns a user's movement; another user's is ErrNotFound.
func (s *Service) Movement(ctx context.Context, kind Kind, userID, id string) (Movement, error) {
	return s.cfg.Store.MovementByID(ctx, kind, userID, id)
}

// Account returns a user's balance.
func (s *Service) Account(ctx context.Context, userID string) (Account, error) {
	return s.cfg.Store.Account(ctx, userID)
}

// Ledger returns a user's whole journal, newest first: its amounts sum to the balance.
func (s *Service) Ledger(ctx context.Context, userID string) ([]LedgerEntry, error) {
	return s.cfg.Store.Ledger(ctx, userID, 0)
}
