package app

import (
	"context"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// Store keeps users, accounts, movements, orders and the ledger; each method is one transaction.
// Errors are ErrNotFound, ErrInsufficientFunds, ErrUsernameTaken, ErrAlreadyPaid and
// ErrStaleFence where said, and errors wrapping ErrUnavailable when the database cannot answer.
type Store interface {
	// CreateUser adds u with an empty account in currency; ErrUsernameTaken.
	CreateUser(ctx context.Context, u User, currency string) error
	// UserByName returns the user with username and its PasswordHash; ErrNotFound.
	UserByName(ctx context.Context, username string) (User, error)
	CreateSession(ctx context.Context, tokenHash, userID string, expiresAt, now time.Time) error
	// SessionUser returns the user of a live session; ErrNotFound.
	SessionUser(ctx context.Context, tokenHash string, now time.Time) (User, error)
	// SessionLive is SessionUser for a session whose user is known: nil when it is live,
	// ErrNotFound when it is not.
	SessionLive(ctx context.Context, tokenHash string, now time.Time) error
	DeleteSession(ctx context.Context, tokenHash string) error

	Account(ctx context.Context, userID string) (Account, error)
	// Ledger returns a user's journal, newest first, at most limit entries (all when limit <= 0).
	Ledger(ctx context.Context, userID string, limit int) ([]LedgerEntry, error)

	// CreateDeposit records a pending deposit; one under the same (user, key) is returned instead, created false.
	CreateDeposit(ctx context.Context, m Movement) (got Movement, created bool, err error)
	// Withdraw records a pending withdrawal and debits it, refusing a fence older than the
	// account accepted (ErrStaleFence; 0: no fence); the same (user, key) returns the first.
	// chk, if not nil, is checked and created in the same transaction: a session that ended
	// is ErrSessionEnded and a key's record that could not be created is its store's refusal,
	// with nothing written.
	Withdraw(ctx context.Context, m Movement, fence int64, chk *TxChecks) (got Movement, created bool, err error)
	// Settle moves a pending movement to outcome, crediting a deposit's success or refunding a
	// withdrawal's failure, and completes rec in the same transaction when it is not nil.
	// event, unless "", is a provider callback's id, recorded once (UNIQUE) in that transaction:
	// ErrDuplicateEvent when it was recorded before, and nothing changes. moved is false when it
	// was settled before; status is the movement's status after the call, another than outcome
	// when it was settled so before (then nothing changes: not the event, not rec). A record the store
	// cannot complete fails it all, or (a store that settles and completes in one statement)
	// leaves the settlement committed and returns ErrRecordLost with its results; ErrNotFound
	// when there is no such movement.
	Settle(ctx context.Context, kind Kind, id string, outcome Status, at time.Time, rec *Record, event string) (moved bool, status Status, err error)
	// FindMovement returns the deposit or withdrawal with id, whoever's it is; ErrNotFound.
	FindMovement(ctx context.Context, id string) (Movement, error)
	// PendingAfter returns up to limit pending movements of kind, oldest first, starting
	// after the one at after (the zero PendingCursor: from the oldest).
	PendingAfter(ctx context.Context, kind Kind, after PendingCursor, limit int) ([]Movement, error)
	// PendingCount counts every pending movement.
	PendingCount(ctx context.Context) (int, error)
	// Movements returns a user's movements of kind, newest first.
	Movements(ctx context.Context, kind Kind, userID string, limit int) ([]Movement, error)
	// MovementByID returns a user's movement; another user's is ErrNotFound.
	MovementByID(ctx context.Context, kind Kind, userID, id string) (Movement, error)

	// CreateOrder stores an order; one under the same (user, key) is returned instead, created false.
	CreateOrder(ctx context.Context, o Order) (got Order, created bool, err error)
	// OrderByID returns a user's order; another user's is ErrNotFound.
	OrderByID(ctx context.Context, userID, id string) (Order, error)
	Orders(ctx context.Context, userID string, limit int) ([]Order, error)
	// PayOrder pays a user's order from the balance under the order's fence: ErrNotFound,
	// ErrAlreadyPaid, ErrInsufficientFunds, ErrStaleFence; the same key returns the first payment.
	PayOrder(ctx context.Context, p Payment, fence int64) (got Payment, created bool, err error)
}

// Record is an Idempotency-Key record that a settlement completes in its own transaction,
// so that the stored answer and the books never disagree after a crash.
type Record struct {
	ID, Lease string
	Answer    Answer
}

// TxChecks is what a movement's transaction checks and creates besides the movement, so that
// one commit makes all of it or none.
type TxChecks struct {
	// SessionHash, if not "", is the hash of the session the request came under: it must still
	// be live when the money moves (ErrSessionEnded), so a sign-out is seen at once.
	SessionHash string
	// Start is the request's Idempotency-Key record to create with the movement, a value the
	// store knows (the SQL store: an *idemstore.Start; nil: it exists already); the key store's
	// refusal (the key taken, the window held, the token refused) is returned as a
	// *StartRefusedError, nothing written.
	Start any
}

// StartRefusedError wraps a key store's refusal to create a request's Idempotency-Key record in
// its movement's transaction (the key taken, the window held, the token refused): nothing was
// written, and the transport answers as its key store's refusal says.
type StartRefusedError struct{ Err error }

func (e *StartRefusedError) Error() string { return e.Err.Error() }
func (e *StartRefusedError) Unwrap() error { return e.Err }

// Answer is the response a key's record stores and replays.
type Answer struct {
	Status int
	Header map[string][]string
	Body   []byte
}

// Provider is the payment provider; every call is idempotent under its key, the movement's id.
type Provider interface {
	// Pay charges (a deposit) or pays out (a withdrawal) amount under key and returns
	// Succeeded or Failed, or Pending when the provider settles later (and calls back);
	// ErrUnknownOutcome when the money may or may not have moved.
	Pay(ctx context.Context, kind Kind, key string, amount money.Amount) (Status, error)
	// Lookup returns the outcome recorded under key (Pending while the provider has not
	// settled it); ErrNoOperation when there is none.
	Lookup(ctx context.Context, key string) (Status, error)
}
