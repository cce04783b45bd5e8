package app

import (
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// User is a user of the service.
type User struct {
	ID, Username string
	PasswordHash string // argon2id; empty when the store did not read it
	CreatedAt    time.Time
}

// Account is a user's balance.
type Account struct {
	UserID   string
	Balance  money.Amount
	Currency string
}

// Session is a signed-in user's bearer token and when it ends.
type Session struct {
	Token     string // the secret: the store keeps only its hash
	ExpiresAt time.Time
}

// Kind is what a movement does to the balance.
type Kind string

// The movement kinds.
const (
	Deposit    Kind = "deposit"    // money in, credited when the provider charged it
	Withdrawal Kind = "withdrawal" // money out, debited before the provider pays it
)

// Status is where a movement is in its life.
type Status string

// The movement statuses: pending until the provider's answer settles it.
const (
	Pending   Status = "pending"
	Succeeded Status = "succeeded"
	Failed    Status = "failed"
)

// Movement is a deposit or a withdrawal.
type Movement struct {
	ID        string
	Kind      Kind
	UserID    string
	Key       string // the Idempotency-Key (or submit token) of the request that made it
	Amount    money.Amount
	Status    Status
	CreatedAt time.Time
}

// OrderStatus is where an order is in its life.
type OrderStatus string

// The order statuses.
const (
	OrderCreated OrderStatus = "created"
	OrderPaid    OrderStatus = "paid"
)

// Order is something a user pays for from their balance.
type Order struct {
	ID, OrderNo, UserID, Key, Description string
	PaymentID                             string // the payment that paid it; "" while unpaid
	Amount                                money.Amount
	Status                                OrderStatus
	CreatedAt                             time.Time
}

// Payment is an order's payment from the balance.
type Payment struct {
	ID, OrderID, UserID, Key string
	Amount                   money.Amount
	Status                   Status
	CreatedAt                time.Time
}

// EntryKind is what a ledger entry records.
type EntryKind string

// The ledger entry kinds.
const (
	EntryDeposit          EntryKind = "deposit"
	EntryWithdrawal       EntryKind = "withdrawal"
	EntryWithdrawalRefund EntryKind = "withdrawal_refund"
	EntryPayment          EntryKind = "payment"
)

// LedgerEntry is one line of a user's journal; the amounts sum to the balance.
type LedgerEntry struct {
	ID           int64
	Kind         EntryKind
	Amount       money.Amount
	BalanceAfter money.Amount
	Ref          string // the movement's or payment's id
	CreatedAt    time.Time
}

// Outcome is what the audit line says happened to a money request.
type Outcome string

// The audit outcomes besides a movement's Status.
const (
	OutcomeBusy              Outcome = "busy"
	OutcomeInsufficientFunds Outcome = "insufficient_funds"
	OutcomeInProgress        Outcome = "in_progress"
	OutcomeAlreadyPaid       Outcome = "already_paid"
	OutcomePaid              Outcome = "paid"
)
