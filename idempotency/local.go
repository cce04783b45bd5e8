package idempotency

import (
	"sync"
	"time"
)

// local is what a Deferred Guard knows of its own keys without asking
// the store: those in flight here (their first request's handler runs),
// answered 409 (or waited on) before the handler's lock and transaction.
// It only saves work: the store still decides. A key finished here takes
// the deferred path again, since only the handler's transaction checks
// the principal (a session that ended since).
//
// It also knows the repeat-submit windows of its keys: one claimed by a
// key in flight here, or by a key whose record was created here, within
// the window. The same body under another key is turned away 429 as
// Begin's claim does without Deferred, once the store's Begin says that
// key has no record of its own (a retry of an older key is replayed, a
// used token refused, as without Deferred): not after waiting for the
// handler's lock to learn it in its transaction, which a lost Redis can
// make a long wait. A hold kept for a record whose commit's outcome was
// unknown (Call.Created) may turn such a body away until the window ends
// though the record was never made: never a duplicate, at worst a wait.
type local struct {
	mu       sync.Mutex
	inflight map[string]chan struct{}
	windows  map[string]windowHold
	swept    time.Time // when windows was last cleared of expired holds
}

// windowHold is a window claimed by the key owner, by its attempt under
// lease; pending while that request runs (until then is the window's end
// if it creates its record).
type windowHold struct {
	owner, lease string
	until        time.Time
	pending      bool
}

// maxWindows bounds the windows kept: past it a new claim is not kept
// here (the store still refuses its duplicates, in the handler's
// transaction).
const maxWindows = 1 << 17

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

// holdWindow claims window w for the key owner's attempt under lease
// until until, unless another key holds it here: then it returns false
// and how long is left (the whole window while that key's request runs).
func (l *local) holdWindow(w, owner, lease string, now, until time.Time) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.windows[w]; ok && (h.pending || h.until.After(now)) {
		switch {
		case h.owner == owner: // a retry of the key that holds it: the store answers
			return 0, true
		case h.pending:
			return until.Sub(now), false
		}
		return h.until.Sub(now), false
	}
	if l.windows == nil {
		l.windows = map[string]windowHold{}
	}
	if window := until.Sub(now); now.Sub(l.swept) > window {
		for k, h := range l.windows {
			if !h.pending && !h.until.After(now) {
				delete(l.windows, k)
			}
		}
		l.swept = now
	}
	if len(l.windows) < maxWindows {
		l.windows[w] = windowHold{owner: owner, lease: lease, until: until, pending: true}
	}
	return 0, true
}

// finish ends a Deferred call's key's flight here, once: its window stays
// held if its record was created, else it is let go.
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
	if h, ok := l.windows[call.windowID]; ok && h.owner == call.ID && h.lease == call.Lease && h.pending {
		if d.created.Load() {
			h.pending = false
			l.windows[call.windowID] = h
		} else {
			delete(l.windows, call.windowID)
		}
	}
}

// dropWindow lets go of the window a key holds here when the key is freed
// (the store's window entry is freed with it): a hold kept for the key's
// record whichever of its calls frees it (a Deferred one, or the one
// Resume began for it), a pending one only by its own attempt, whose
// request still runs.
func (l *local) dropWindow(call *Call) {
	if call.windowID == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.windows[call.windowID]; ok && h.owner == call.ID && (!h.pending || h.lease == call.Lease) {
		delete(l.windows, call.windowID)
	}
}
