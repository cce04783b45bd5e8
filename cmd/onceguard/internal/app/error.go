package app

import (
	"errors"
	"fmt"
)

// The error codes the service answers; the HTTP layer maps each to a status.
const (
	CodeInvalid           = "invalid_request"
	CodeInvalidUsername   = "invalid_username"
	CodeInvalidPassword   = "invalid_password"
	CodeInvalidAmount     = "invalid_amount"
	CodeInvalidPurpose    = "invalid_purpose"
	CodeUsernameTaken     = "username_taken"
	CodeInvalidCreds      = "invalid_credentials"
	CodeUnauthenticated   = "unauthenticated"
	CodeNotFound          = "not_found"
	CodeInsufficientFunds = "insufficient_funds"
	CodeBalanceLimit      = "balance_limit"
	CodeKeyReused         = "idempotency_key_reused"
	CodePaymentInProgress = "payment_in_progress"
	CodeAlreadyPaid       = "order_already_paid"
	CodeNotifyConflict    = "notification_conflict"
	CodeBusy              = "busy"
	CodeInterrupted       = "request_interrupted"
	CodeUnavailable       = "store_unavailable"
	CodeInternal          = "internal"
)

// Error is a failure a caller can act on: Code says which, Message says it to a person.
type Error struct {
	Code    string
	Message string
	Err     error // the cause, if any
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("app: %s: %s: %v", e.Code, e.Message, e.Err)
	}
	return "app: " + e.Code + ": " + e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Is matches another *Error by its code, so the sentinels below work with errors.Is.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Errorf returns an *Error with code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode is err's code: its *Error's, else CodeInternal (nil: "").
func ErrorCode(err error) string {
	var e *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Code
	}
	return CodeInternal
}

// The errors the store and the service return; errors.Is matches them by code.
var (
	ErrNotFound          = &Error{Code: CodeNotFound, Message: "no such resource"}
	ErrInsufficientFunds = &Error{Code: CodeInsufficientFunds, Message: "the balance does not cover this; nothing changed"}
	ErrUsernameTaken     = &Error{Code: CodeUsernameTaken, Message: "choose another username"}
	ErrAlreadyPaid       = &Error{Code: CodeAlreadyPaid, Message: "this order has been paid"}
	ErrKeyReused         = &Error{Code: CodeKeyReused, Message: "this key was already used for a different request; use a new key"}
	ErrInvalidCreds      = &Error{Code: CodeInvalidCreds, Message: "wrong username or password"}
	ErrBalanceLimit      = &Error{Code: CodeBalanceLimit, Message: "this deposit would take the balance over the most an account can hold; nothing changed"}
)

// ErrSessionEnded: the session a request came under ended (a sign-out, its expiry) before its
// transaction moved money; nothing changed.
var ErrSessionEnded = &Error{Code: CodeUnauthenticated, Message: "sign in first"}

// ErrRecordLost: a settlement committed, but without completing the key's record it was given
// (the record's lease was lost to a retry that took the key over); Store.Settle returns it with
// the settlement's results.
var ErrRecordLost = errors.New("app: settled, the key's record not completed")

// ErrStaleFence: a write carried a fence older than one its resource accepted; nothing changed.
// The service retries it under a new lease and answers busy if that keeps happening.
var ErrStaleFence = errors.New("app: stale fencing token")

// ErrUnavailable marks a store error that means the database could not answer now.
var ErrUnavailable = errors.New("app: store unavailable")

// ErrUnknownOutcome is a provider's answer when it may or may not have moved the money.
var ErrUnknownOutcome = errors.New("app: provider outcome unknown")

// ErrNoOperation is a provider's answer to Lookup when it has nothing under that key.
var ErrNoOperation = errors.New("app: provider has no operation under that key")

// ErrDuplicateEvent is a store's answer to a settlement whose provider event was recorded before.
var ErrDuplicateEvent = errors.New("app: provider event already recorded")
