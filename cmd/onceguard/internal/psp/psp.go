// Package psp is the payment provider side of the reference service: the
// Provider interface the service calls, and Sim, a simulated provider that
// honours idempotency keys like a real one (same key, same result, never a
// second movement of money), can be asked about a key, and injects faults
// on demand, including the worst one: a timeout after the money moved.
package psp

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// Kind is what an operation does.
type Kind string

// Operation kinds.
const (
	Charge Kind = "charge" // money in: the customer pays
	Payout Kind = "payout" // money out: the customer is paid
)

// Status is an operation's outcome.
type Status string

// Operation outcomes.
const (
	Succeeded Status = "succeeded"
	Failed    Status = "failed" // definite: no money moved; retry only under a new key
)

// Errors a Provider returns.
var (
	// ErrUnknownOutcome: the call timed out or the connection broke; the
	// money may or may not have moved. Ask with Lookup (same key), or
	// retry with the same key and the same parameters; never pay again
	// under a new key.
	ErrUnknownOutcome = errors.New("psp: outcome unknown")
	// ErrNotFound: Lookup found no operation with that key.
	ErrNotFound = errors.New("psp: no operation with that key")
	// ErrKeyReused: the key was used for a different operation.
	ErrKeyReused = errors.New("psp: idempotency key reused with different parameters")
	// ErrInvalid: bad parameters (empty key, amount not positive).
	ErrInvalid = errors.New("psp: invalid request")
)

// Operation is one charge or payout as the provider records it.
type Operation struct {
	ID        string       `json:"id"`
	Key       string       `json:"key"`
	Kind      Kind         `json:"kind"`
	Amount    money.Amount `json:"amount"`
	Status    Status       `json:"status"`
	CreatedAt time.Time    `json:"created_at"`
}

// Provider is a payment provider. Every method is safe to retry with the
// same arguments: the key makes it idempotent.
type Provider interface {
	// Do performs kind for amount under key, or returns the operation
	// already recorded for key. A definite failure is an Operation with
	// Status Failed and a nil error; ErrUnknownOutcome means ask again.
	Do(ctx context.Context, kind Kind, key string, amount money.Amount) (Operation, error)
	// Lookup returns the operation recorded for key, or ErrNotFound.
	Lookup(ctx context.Context, key string) (Operation, error)
}

// Fault is one injected misbehaviour, applied to the next call of Do.
type Fault string

// Faults Sim can inject.
const (
	// TimeoutAfterCommit moves the money, records it, then answers
	// ErrUnknownOutcome: the case the service must settle by asking.
	TimeoutAfterCommit Fault = "timeout_after_commit"
	// TimeoutBeforeCommit answers ErrUnknownOutcome without moving money.
	TimeoutBeforeCommit Fault = "timeout_before_commit"
	// Decline records a definite failure (Status Failed) for the key.
	Decline Fault = "decline"
)

// Sim is the simulated provider. The zero value is ready to use; it is
// safe for concurrent use.
type Sim struct {
	// Latency is added to every Do and Lookup. Default: none.
	Latency time.Duration

	mu     sync.Mutex
	ops    map[string]Operation
	faults []Fault
	seq    int
	moved  map[Kind]money.Amount // money actually moved, by kind
	counts map[Kind]int          // operations that moved money, by kind
}

var _ Provider = (*Sim)(nil)

// Inject queues faults for the next calls of Do, one per call, in order.
func (s *Sim) Inject(faults ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, faults...)
}

// Moved returns how many operations of kind moved money, and how much.
func (s *Sim) Moved(kind Kind) (count int, total money.Amount) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[kind], s.moved[kind]
}

func (s *Sim) wait(ctx context.Context) error {
	if s.Latency <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(s.Latency)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, ctx.Err())
	}
}

// Do implements Provider.
func (s *Sim) Do(ctx context.Context, kind Kind, key string, amount money.Amount) (Operation, error) {
	if key == "" || len(key) > 255 || amount <= 0 || (kind != Charge && kind != Payout) {
		return Operation{}, ErrInvalid
	}
	if err := s.wait(ctx); err != nil {
		return Operation{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if op, ok := s.ops[key]; ok {
		if op.Kind != kind || op.Amount != amount {
			return Operation{}, ErrKeyReused
		}
		return op, nil // the same key: the same result, nothing moves again
	}
	var fault Fault
	if len(s.faults) > 0 {
		fault, s.faults = s.faults[0], s.faults[1:]
	}
	if fault == TimeoutBeforeCommit {
		return Operation{}, ErrUnknownOutcome
	}
	if s.ops == nil {
		s.ops, s.moved, s.counts = make(map[string]Operation), make(map[Kind]money.Amount), make(map[Kind]int)
	}
	s.seq++
	op := Operation{ID: "op_" + strconv.Itoa(s.seq), Key: key, Kind: kind, Amount: amount, Status: Succeeded, CreatedAt: time.Now().UTC()}
	if fault == Decline {
		op.Status = Failed
	} else {
		s.moved[kind] += amount
		s.counts[kind]++
	}
	s.ops[key] = op
	if fault == TimeoutAfterCommit {
		return Operation{}, ErrUnknownOutcome
	}
	return op, nil
}

// Lookup implements Provider.
func (s *Sim) Lookup(ctx context.Context, key string) (Operation, error) {
	if err := s.wait(ctx); err != nil {
		return Operation{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	op, ok := s.ops[key]
	if !ok {
		return Operation{}, ErrNotFound
	}
	return op, nil
}
