// Package memstore keeps idempotency records, submit tokens and the
// repeat-submit window in process memory, under one mutex, so binding a
// token and creating a key's record are one atomic step. For tests and
// single-process programs; it forgets everything on restart.
//
// Memory stays bounded: a write drops what expired over a second ago,
// scanning every entry at most once a second of the clock it is given.
package memstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"sync"
	"time"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/token"
)

// Store implements idemstore.FullStore. A zero Store is ready to use; it
// must not be copied after first use. It is safe for concurrent use.
type Store struct {
	mu        sync.Mutex
	records   map[string]*entry
	tokens    map[string]*tokenEntry
	windows   map[string]window
	nextSweep time.Time
	leases    string // random hex, cut into lease ids (see newLease)
	watchers  map[string][]chan struct{}
}

// entry is a key's record, with its answer once completed.
type entry struct {
	fp         string
	state      idemstore.State
	lease      string // in flight: the holder's
	leaseUntil time.Time
	expiresAt  time.Time
	tokenHash  string

	// Completed: the answer. The header is kept as name, value pairs,
	// each name's together, in room for one pair in the entry itself
	// (Middleware stores one Content-Type); a header with a name without
	// values is kept whole instead.
	status  int
	body    []byte
	noHdr   bool
	pairs   []string
	pairBuf [2]string
	odd     http.Header
	replay  *idemstore.Record // made on the first replay, shared by the later ones
}

type tokenEntry struct {
	rec  token.Record
	keep time.Time // a bound token is kept as long as its record
}

type window struct {
	owner   string
	expires time.Time
}

var (
	_ idemstore.FullStore        = (*Store)(nil)
	_ idemstore.SignedTokenStore = (*Store)(nil)
)

// sweepEvery is how often, at most, a write scans for expired entries.
const sweepEvery = time.Second

// init makes the maps and drops what expired sweepEvery before now or
// earlier (a token just past its time still says so: token.ErrExpired,
// not ErrUnknown). s.mu is held.
func (s *Store) init(now time.Time) {
	if s.records == nil {
		s.records = make(map[string]*entry)
		s.tokens = make(map[string]*tokenEntry)
		s.windows = make(map[string]window)
	}
	if now.Before(s.nextSweep) {
		return
	}
	s.nextSweep = now.Add(sweepEvery)
	before := now.Add(-sweepEvery)
	for id, e := range s.records {
		if !before.Before(e.expiresAt) {
			delete(s.records, id)
		}
	}
	for h, t := range s.tokens {
		if !before.Before(t.keep) {
			delete(s.tokens, h)
		}
	}
	for id, w := range s.windows {
		if !before.Before(w.expires) {
			delete(s.windows, id)
		}
	}
}

// Len returns how many records, tokens and window entries are kept.
func (s *Store) Len() (records, tokens, windows int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records), len(s.tokens), len(s.windows)
}

// Begin implements idemstore.Store.
func (s *Store) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	if err := ctx.Err(); err != nil {
		return idemstore.BeginResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init(r.Now)
	e := s.records[r.ID]
	if e != nil && !r.Now.Before(e.expiresAt) {
		delete(s.records, r.ID)
		e = nil
	}
	switch {
	case e == nil:
		e = &entry{fp: r.Fingerprint, state: idemstore.InFlight, lease: s.newLease(), leaseUntil: r.Now.Add(r.Lease), expiresAt: r.Now.Add(r.TTL)}
		if t := r.Token; t != nil {
			var err error
			if t.Signed {
				err = s.bindSigned(t, e.expiresAt)
			} else {
				_, err = s.bind(t.Hash, t.Subject, t.Purpose, t.Scope, r.Now, e.expiresAt)
			}
			if err != nil {
				return idemstore.BeginResult{}, err
			}
			e.tokenHash = t.Hash
		}
		s.records[r.ID] = e
		return idemstore.BeginResult{Outcome: idemstore.Started, Lease: e.lease}, nil
	case e.fp != r.Fingerprint:
		return idemstore.BeginResult{Outcome: idemstore.Mismatch, Record: e.record(r.ID)}, nil
	case e.state == idemstore.Completed:
		return idemstore.BeginResult{Outcome: idemstore.Replay, Record: e.record(r.ID)}, nil
	case r.Now.Before(e.leaseUntil):
		return idemstore.BeginResult{Outcome: idemstore.InProgress, Record: e.record(r.ID)}, nil
	}
	// In flight, but its holder stopped renewing (crashed): take it over.
	e.lease, e.leaseUntil = s.newLease(), r.Now.Add(r.Lease)
	return idemstore.BeginResult{Outcome: idemstore.Started, Lease: e.lease, Recovered: true}, nil
}

// record returns e as an idemstore.Record. A completed entry no longer
// changes, so its Record is made once and shared (read-only, as
// Store.Begin says).
func (e *entry) record(id string) *idemstore.Record {
	if e.replay != nil {
		return e.replay
	}
	rec := &idemstore.Record{ID: id, Fingerprint: e.fp, State: e.state, Lease: e.lease,
		LeaseUntil: e.leaseUntil, ExpiresAt: e.expiresAt, TokenHash: e.tokenHash}
	if e.state == idemstore.Completed {
		rec.Response = &idemstore.Response{Status: e.status, Header: e.header(), Body: e.body}
		e.replay = rec
	}
	return rec
}

// keepHeader keeps a copy of h: its values' strings are shared, as
// strings are immutable, its slices are not.
func (e *entry) keepHeader(h http.Header) {
	if h == nil {
		e.noHdr = true
		return
	}
	e.pairs = e.pairBuf[:0]
	for k, vs := range h {
		if len(vs) == 0 {
			e.odd, e.pairs = h.Clone(), nil
			return
		}
		for _, v := range vs {
			e.pairs = append(e.pairs, k, v)
		}
	}
}

// header returns the kept header, as http.Header.Clone would copy it.
func (e *entry) header() http.Header {
	switch {
	case e.noHdr:
		return nil
	case e.odd != nil:
		return e.odd
	}
	h := make(http.Header)
	values := make([]string, len(e.pairs)/2)
	for i, j := 0, 0; i < len(e.pairs); {
		name, start := e.pairs[i], j
		for ; i < len(e.pairs) && e.pairs[i] == name; i, j = i+2, j+1 {
			values[j] = e.pairs[i+1]
		}
		h[name] = values[start:j:j] // no room to append into the next name's values
	}
	return h
}

// Complete implements idemstore.Store. It keeps a copy of resp.
func (s *Store) Complete(ctx context.Context, id, lease string, resp idemstore.Response, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.records[id]
	if e == nil || e.state != idemstore.InFlight || e.lease != lease {
		return idemstore.ErrLeaseLost
	}
	e.state, e.lease = idemstore.Completed, ""
	e.status, e.body = resp.Status, append([]byte(nil), resp.Body...)
	e.keepHeader(resp.Header)
	s.wake(id)
	return nil
}

// Abandon implements idemstore.Store.
func (s *Store) Abandon(ctx context.Context, id, lease string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.records[id]
	if e == nil || e.state != idemstore.InFlight || e.lease != lease {
		return idemstore.ErrLeaseLost
	}
	delete(s.records, id)
	if t := s.tokens[e.tokenHash]; e.tokenHash != "" && t != nil {
		t.rec.Scope = ""
		t.keep = t.rec.ExpiresAt
	}
	s.wake(id)
	return nil
}

// Watch implements idemstore.Notifier: the channel is closed when the
// record id is completed or abandoned.
func (s *Store) Watch(ctx context.Context, id string) (<-chan struct{}, func(), error) {
	ch := make(chan struct{})
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watchers == nil {
		s.watchers = make(map[string][]chan struct{})
	}
	s.watchers[id] = append(s.watchers[id], ch)
	stop := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		w := s.watchers[id]
		for i, c := range w {
			if c == ch {
				w = append(w[:i:i], w[i+1:]...)
				break
			}
		}
		if len(w) == 0 {
			delete(s.watchers, id)
		} else {
			s.watchers[id] = w
		}
	}
	return ch, stop, nil
}

// wake closes the channels watching id; s.mu is held.
func (s *Store) wake(id string) {
	if len(s.watchers) == 0 {
		return
	}
	for _, c := range s.watchers[id] {
		close(c)
	}
	delete(s.watchers, id)
}

// ClaimWindow implements idemstore.WindowStore.
func (s *Store) ClaimWindow(ctx context.Context, id, owner string, d time.Duration, now time.Time) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init(now)
	if w, ok := s.windows[id]; ok && now.Before(w.expires) {
		if w.owner == owner {
			return 0, nil
		}
		if idemstore.WindowRecord(w.owner) == idemstore.WindowRecord(owner) {
			s.windows[id] = window{owner: owner, expires: w.expires}
			return 0, nil
		}
		// At most d: a request that started before the winner's sees more.
		return min(w.expires.Sub(now), d), nil
	}
	s.windows[id] = window{owner: owner, expires: now.Add(d)}
	return 0, nil
}

// FreeWindow implements idemstore.WindowStore.
func (s *Store) FreeWindow(ctx context.Context, id, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.windows[id]; ok && w.owner == owner {
		delete(s.windows, id)
	}
	return nil
}

// PutToken implements token.Store.
func (s *Store) PutToken(ctx context.Context, r token.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init(time.Now())
	s.tokens[r.Hash] = &tokenEntry{rec: r, keep: r.ExpiresAt}
	return nil
}

// GetToken implements token.Store.
func (s *Store) GetToken(ctx context.Context, hash string) (token.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tokens[hash]
	if t == nil {
		return token.Record{}, token.ErrUnknown
	}
	return t.rec, nil
}

// BindToken implements token.Store. A token bound on its own (not through
// Begin) is kept for token.BoundTTL after binding.
func (s *Store) BindToken(ctx context.Context, hash, subject, purpose, scope string, now time.Time) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bind(hash, subject, purpose, scope, now, now.Add(token.BoundTTL))
}

// bind binds the token to scope and keeps it until keep. s.mu is held.
func (s *Store) bind(hash, subject, purpose, scope string, now, keep time.Time) (bool, error) {
	t := s.tokens[hash]
	if t == nil {
		return false, token.ErrUnknown
	}
	if err := t.rec.Check(subject, purpose, scope, now); err != nil {
		return false, err
	}
	if t.rec.Scope == scope {
		return false, nil
	}
	t.rec.Scope, t.keep = scope, keep
	return true, nil
}

// BindsSignedTokens implements idemstore.SignedTokenStore: a signed
// token, which has no record of its own, is bound to the scope of the
// first key's record it creates, and kept as long as that record.
func (s *Store) BindsSignedTokens() {}

// bindSigned binds the signed token of c to its scope, kept until keep:
// token.ErrUsed when another scope holds it, token.ErrExpired when it is
// past its time (it may only answer a record it created, which exists:
// Begin does not get here then). s.mu is held.
func (s *Store) bindSigned(c *idemstore.TokenClaim, keep time.Time) error {
	if c.Expired {
		return token.ErrExpired
	}
	t := s.tokens[c.Hash]
	switch {
	case t == nil || t.rec.Scope == "": // never used, or freed by Abandon
		s.tokens[c.Hash] = &tokenEntry{rec: token.Record{Hash: c.Hash, Subject: c.Subject, Purpose: c.Purpose, Scope: c.Scope}, keep: keep}
		return nil
	case t.rec.Scope == c.Scope: // its own request's record, gone before it
		t.keep = keep
		return nil
	}
	return token.ErrUsed
}

// UnbindToken implements token.Store.
func (s *Store) UnbindToken(ctx context.Context, hash, scope string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.tokens[hash]; t != nil && t.rec.Scope == scope {
		t.rec.Scope = ""
		t.keep = t.rec.ExpiresAt
	}
	return nil
}

// leaseLen is the length of a lease id: 8 random bytes in hex. A lease
// only has to differ from the one it replaces, and never leaves the
// process.
const leaseLen = 16

// newLease returns a random lease id, cut from a string of 64 of them made
// at once from crypto/rand: a record then costs no allocation for its
// lease. s.mu is held.
func (s *Store) newLease() string {
	if len(s.leases) < leaseLen {
		var b [64 * leaseLen / 2]byte
		_, _ = rand.Read(b[:])
		s.leases = hex.EncodeToString(b[:])
	}
	l := s.leases[:leaseLen]
	s.leases = s.leases[leaseLen:]
	return l
}
