package lock

import "errors"

// Sentinel errors returned by every backend, so that errors.Is works whatever
// the backend. Backends wrap them with the operation and the key.
var (
	// ErrNotAcquired means the lock is held by someone else (or, for a
	// blocking Acquire, was not obtained before the context ended; then
	// the error also matches ctx.Err()).
	ErrNotAcquired = errors.New("lock: not acquired")

	// ErrNotHeld means a release or refresh was refused because the caller
	// no longer holds the lock: it expired, or another owner holds it now.
	// Nothing was changed on the server.
	ErrNotHeld = errors.New("lock: not held")

	// ErrExpired is the ErrNotHeld case where the lease ran out and nobody
	// holds the lock now. errors.Is(ErrExpired, ErrNotHeld) is true. Seeing it
	// at release means the work took longer than the TTL: raise the TTL
	// above the work's p99 or use automatic renewal.
	ErrExpired error = &childError{msg: "lock: lease expired", parent: ErrNotHeld}

	// ErrReleased is the cause a lease's context carries after Release.
	ErrReleased = errors.New("lock: lease released")

	// ErrLost is the cause a lease's context carries when the lease ended
	// without Release: its TTL passed locally, or renewal found the lock
	// gone. The cause also matches the underlying error.
	ErrLost = errors.New("lock: lease lost")

	// ErrInvalidKey means the key is empty or longer than MaxKeyLen bytes.
	ErrInvalidKey = errors.New("lock: invalid key")

	// ErrInvalidTTL means the TTL is below one millisecond.
	ErrInvalidTTL = errors.New("lock: invalid ttl")

	// ErrUnavailable means the backend could not be reached or did not
	// answer in time (connection refused or reset, timeout, a closed pool).
	// It is what fallback lockers switch on.
	ErrUnavailable = errors.New("lock: backend unavailable")
)

// childError is a sentinel that also matches a broader sentinel.
type childError struct {
	msg    string
	parent error
}

func (e *childError) Error() string        { return e.msg }
func (e *childError) Is(target error) bool { return target == e.parent }
