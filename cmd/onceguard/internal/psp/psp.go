// Package psp is the payment provider side of the reference service: the
// Provider interface the service calls, and Sim, a simulated provider that
// honours idempotency keys like a real one (same key, same result, never a
// second movement of money), can be asked about a key, and injects faults
// on demand, including the worst one: a timeout after the money moved.
// Sim can also settle later (Async) and call the merchant back with signed
// events (Notifier), redelivered until answered, with faults of their own.
package psp

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
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
	Failed    Status = "failed"  // definite: no money moved; retry only under a new key
	Pending   Status = "pending" // accepted, settled later (Sim.Async); ask again or wait for the callback
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
	// Status Failed and a nil error; Status Pending means it settles later;
	// ErrUnknownOutcome means ask again.
	Do(ctx context.Context, kind Kind, key string, amount money.Amount) (Operation, error)
	// Lookup returns the operation recorded for key, or ErrNotFound.
	Lookup(ctx context.Context, key string) (Operation, error)
}

// Fault is one injected misbehaviour, applied to the next call of Do, or
// for the notify_ faults to the next callback.
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

	// NotifyDuplicate delivers the next callback 5 times at once.
	NotifyDuplicate Fault = "notify_duplicate"
	// NotifyDelay holds the next callback back (Notifier.Delay, 2s), so a later one overtakes it.
	NotifyDelay Fault = "notify_delay"
	// NotifyDrop never delivers the next callback.
	NotifyDrop Fault = "notify_drop"
	// NotifyBadSignature signs the next callback's first delivery wrongly; redeliveries are correct.
	NotifyBadSignature Fault = "notify_bad_signature"
)

// Known reports whether f is a fault Sim injects.
func (f Fault) Known() bool {
	switch f {
	case TimeoutAfterCommit, TimeoutBeforeCommit, Decline, NotifyDuplicate, NotifyDelay, NotifyDrop, NotifyBadSignature:
		return true
	}
	return false
}

func (f Fault) notify() bool { return strings.HasPrefix(string(f), "notify_") }

// DefaultSettleAfter is how long an Async Sim takes to settle an operation.
const DefaultSettleAfter = 100 * time.Millisecond

// Sim is the simulated provider. The zero value is ready to use; it is
// safe for concurrent use. With Async or a Notifier, settlements and
// callbacks run in goroutines of Run, which must be running for them to
// happen (they wait for it) and stops them all when its context ends.
type Sim struct {
	// Latency is added to every Do and Lookup. Default: none.
	Latency time.Duration
	// Async makes Do answer Status Pending at once and settle SettleAfter
	// later (needs Run). Default: settled at once.
	Async bool
	// SettleAfter is how long an Async operation stays pending. 0 means DefaultSettleAfter.
	SettleAfter time.Duration
	// Notifier, if set, calls the merchant back for every operation that settles (needs Run).
	Notifier *Notifier

	mu           sync.Mutex
	ops          map[string]Operation
	faults       []Fault // for Do
	notifyFaults []Fault // for callbacks
	seq          int
	moved        map[Kind]money.Amount // money actually moved, by kind
	counts       map[Kind]int          // operations that moved money, by kind

	// The background work, under mu: started on life once Run runs,
	// queued before, refused once Run's context ended.
	life    context.Context
	queued  []func(context.Context)
	stopped bool
	work    sync.WaitGroup
}

var _ Provider = (*Sim)(nil)

// Inject queues faults for the next calls of Do, one per call, in order;
// the notify_ faults for the next callbacks, one per callback.
func (s *Sim) Inject(faults ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range faults {
		if f.notify() {
			s.notifyFaults = append(s.notifyFaults, f)
		} else {
			s.faults = append(s.faults, f)
		}
	}
}

// Run runs the settlements of an Async Sim and the Notifier's deliveries
// until ctx ends, then waits for them to stop; call it once.
func (s *Sim) Run(ctx context.Context) {
	s.mu.Lock()
	s.life = ctx
	queued := s.queued
	s.queued = nil
	for _, f := range queued {
		s.spawnLocked(f)
	}
	s.mu.Unlock()
	<-ctx.Done()
	s.mu.Lock()
	s.stopped = true // no new work: Add must not race Wait
	s.mu.Unlock()
	s.work.Wait()
	if s.Notifier != nil {
		s.Notifier.client().CloseIdleConnections()
	}
}

// spawnLocked runs f in a goroutine of Run, or queues it until Run starts.
func (s *Sim) spawnLocked(f func(context.Context)) {
	switch {
	case s.stopped:
	case s.life == nil:
		s.queued = append(s.queued, f)
	default:
		ctx := s.life
		s.work.Add(1)
		go func() {
			defer s.work.Done()
			f(ctx)
		}()
	}
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
	op := Operation{ID: "op_" + strconv.Itoa(s.seq), Key: key, Kind: kind, Amount: amount, Status: Pending, CreatedAt: time.Now().UTC()}
	s.ops[key] = op
	if s.Async {
		after := s.SettleAfter
		if after <= 0 {
			after = DefaultSettleAfter
		}
		s.spawnLocked(func(ctx context.Context) {
			if sleep(ctx, after) {
				s.mu.Lock()
				defer s.mu.Unlock()
				s.settleLocked(key, fault == Decline)
			}
		})
	} else {
		op = s.settleLocked(key, fault == Decline)
	}
	if fault == TimeoutAfterCommit {
		return Operation{}, ErrUnknownOutcome
	}
	return op, nil
}

// settleLocked settles the pending operation under key, moving its money
// unless declined, and sends its callback.
func (s *Sim) settleLocked(key string, declined bool) Operation {
	op := s.ops[key]
	op.Status = Succeeded
	if declined {
		op.Status = Failed
	} else {
		s.moved[op.Kind] += op.Amount
		s.counts[op.Kind]++
	}
	s.ops[key] = op
	if s.Notifier != nil {
		var fault Fault
		if len(s.notifyFaults) > 0 {
			fault, s.notifyFaults = s.notifyFaults[0], s.notifyFaults[1:]
		}
		ev := newEvent(op)
		s.spawnLocked(func(ctx context.Context) { s.Notifier.deliver(ctx, ev, fault) })
	}
	return op
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
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
