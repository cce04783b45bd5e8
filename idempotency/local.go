package idempotency

import "sync"

// local is what a Deferred Guard knows of its own keys without asking
// the store: those in flight here (their first request's handler runs),
// answered 409 (or waited on) before the handler's lock and transaction.
// It only saves work: the store still decides. A key finished here takes
// the deferred path again, since only the handler's transaction checks
// the principal (a session that ended since).
type local struct {
	mu       sync.Mutex
	inflight map[string]chan struct{}
}

type keyState int

const (
	keyNew      keyState = iota // not in flight here: take the deferred path
	keyInFlight                 // its first request runs here
)

// claim registers id as in flight and returns its done channel, unless it
// is in flight already (its channel, to wait on).
func (l *local) claim(id string) (chan struct{}, keyState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ch, ok := l.inflight[id]; ok {
		return ch, keyInFlight
	}
	if l.inflight == nil {
		l.inflight = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	l.inflight[id] = ch
	return ch, keyNew
}

// finish ends a Deferred call's key's flight here, once.
func (l *local) finish(call *Call) {
	d := call.deferred
	if d == nil || d.done == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight[call.ID] != d.done {
		return // finished already
	}
	delete(l.inflight, call.ID)
	close(d.done)
}
