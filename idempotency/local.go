package idempotency

import "sync"

// local is what a Deferred Guard knows of its own keys without asking
// the store: those in flight here (their first request's handler runs),
// and those finished moments ago (the last maxRecent). It only saves work:
// the store still decides, so a key it does not know of (another
// instance's, or one finished long ago) takes the deferred path, and the
// handler's transaction finds it taken.
type local struct {
	mu       sync.Mutex
	inflight map[string]chan struct{}
	recent   map[string]struct{}
	order    []string // recent, oldest first, as a ring of maxRecent
	next     int
}

const maxRecent = 4096

type keyState int

const (
	keyNew      keyState = iota // not known here: take the deferred path
	keyInFlight                 // its first request runs here
	keyRecent                   // finished moments ago: ask the store
)

// claim registers id as in flight and returns its done channel, unless it
// is in flight (its channel, to wait on) or recent.
func (l *local) claim(id string) (chan struct{}, keyState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ch, ok := l.inflight[id]; ok {
		return ch, keyInFlight
	}
	// A key finished here is not looked up in the store by its own path:
	// the handler's transaction is what checks the principal (a session
	// that ended since), so it takes the deferred path again.
	if l.inflight == nil {
		l.inflight, l.recent, l.order = map[string]chan struct{}{}, map[string]struct{}{}, make([]string, maxRecent)
	}
	ch := make(chan struct{})
	l.inflight[id] = ch
	return ch, keyNew
}

// finish moves a Deferred call's key from in flight to recent, once.
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
	if old := l.order[l.next]; old != "" {
		delete(l.recent, old)
	}
	l.order[l.next] = call.ID
	l.recent[call.ID] = struct{}{}
	l.next = (l.next + 1) % maxRecent
}
