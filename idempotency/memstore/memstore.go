// Package memstore keeps idempotency records, submit tokens and the
// repeat-submit window in process memory, under one mutex, so binding a
// token and creating a key's record are one atomic step. For tests and
// single-process programs; it forgets everything on restart.
//
// Memory stays bounded: every write first drops what has expired, found
// in O(log n) through a min-heap of deadlines. A record is one allocation
// (its lease id and a completed answer's body are the others), so a
// request allocates little.
package memstore

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	mrand "math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/token"
)

// Store implements idempotency.FullStore. A zero Store is ready to use; it
// must not be copied after first use. It is safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	records map[string]*entry
	tokens  map[string]*tokenEntry
	windows map[string]window
	expiry  deadlines      // when each record, token and window entry may go
	leases  *mrand.ChaCha8 // lease ids, seeded from crypto/rand
}

// entry is a key's record, with its answer once completed: the fields of
// an idempotency.Record, in one allocation with room for a small header.
type entry struct {
	fp         string
	state      idempotency.State
	lease      string
	leaseUntil time.Time
	expiresAt  time.Time
	tokenHash  string

	// Completed: the answer.
	status int
	body   []byte
	noHdr  bool     // the header was nil
	pairs  []string // the header's name, value pairs, each name's together
	bare   []bare   // names without values (rare)
	inline [4]string
}

type bare struct {
	name  string
	isNil bool
}

// record returns a copy of e as an idempotency.Record, with a copy of its
// header (as http.Header.Clone makes it; the body is shared, read-only).
func (e *entry) record(id string) *idempotency.Record {
	c := &struct {
		rec  idempotency.Record
		resp idempotency.Response
	}{rec: idempotency.Record{
		ID: id, Fingerprint: e.fp, State: e.state, Lease: e.lease,
		LeaseUntil: e.leaseUntil, ExpiresAt: e.expiresAt, TokenHash: e.tokenHash,
	}}
	if e.state == idempotency.Completed {
		c.resp = idempotency.Response{Status: e.status, Header: e.header(), Body: e.body}
		c.rec.Response = &c.resp
	}
	return &c.rec
}

func (e *entry) setHeader(h http.Header) {
	if h == nil {
		e.noHdr = true
		return
	}
	n := 0
	for _, v := range h {
		n += 2 * len(v)
	}
	e.pairs = e.inline[:0]
	if n > len(e.inline) {
		e.pairs = make([]string, 0, n)
	}
	for k, vs := range h {
		if len(vs) == 0 {
			e.bare = append(e.bare, bare{name: k, isNil: vs == nil})
		}
		for _, v := range vs {
			e.pairs = append(e.pairs, k, v)
		}
	}
}

func (e *entry) header() http.Header {
	if e.noHdr {
		return nil
	}
	names := len(e.bare)
	for i := 0; i < len(e.pairs); i += 2 {
		if i == 0 || e.pairs[i] != e.pairs[i-2] {
			names++
		}
	}
	h := make(http.Header, names)
	values := make([]string, len(e.pairs)/2)
	for i, j := 0, 0; i < len(e.pairs); {
		name, start := e.pairs[i], j
		for ; i < len(e.pairs) && e.pairs[i] == name; i, j = i+2, j+1 {
			values[j] = e.pairs[i+1]
		}
		h[name] = values[start:j:j]
	}
	for _, b := range e.bare {
		if b.isNil {
			h[b.name] = nil
		} else {
			h[b.name] = []string{}
		}
	}
	return h
}

// deadline says that the entry k of a kind may be dropped at at, if it
// still has that deadline (a later write may have extended it).
type deadline struct {
	at   time.Time
	k    string // the entry's id
	kind byte   // 'r' record, 't' token, 'w' window
}

// deadlines is a min-heap on at.
type deadlines []deadline

func (d *deadlines) push(x deadline) {
	*d = append(*d, x)
	h := *d
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h[i].at.Before(h[p].at) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (d *deadlines) pop() deadline {
	h := *d
	x := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && h[l].at.Before(h[m].at) {
			m = l
		}
		if r := l + 1; r < n && h[r].at.Before(h[m].at) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*d = h
	return x
}

func (s *Store) expireAt(kind byte, k string, at time.Time) {
	s.expiry.push(deadline{at: at, k: k, kind: kind})
}

type tokenEntry struct {
	rec  token.Record
	keep time.Time // a bound token is kept as long as its record
}

type window struct {
	owner   string
	expires time.Time
}

var _ idempotency.FullStore = (*Store)(nil)

func (s *Store) init(now time.Time) {
	if s.records == nil {
		s.records = make(map[string]*entry)
		s.tokens = make(map[string]*tokenEntry)
		s.windows = make(map[string]window)
	}
	for len(s.expiry) > 0 && !now.Before(s.expiry[0].at) {
		d := s.expiry.pop()
		switch d.kind {
		case 'r':
			if r := s.records[d.k]; r != nil && !now.Before(r.expiresAt) {
				delete(s.records, d.k)
			}
		case 't':
			if t := s.tokens[d.k]; t != nil && !now.Before(t.keep) {
				delete(s.tokens, d.k)
			}
		case 'w':
			if w, ok := s.windows[d.k]; ok && !now.Before(w.expires) {
				delete(s.windows, d.k)
			}
		}
	}
}

// Len returns how many records, tokens and window entries are kept.
func (s *Store) Len() (records, tokens, windows int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records), len(s.tokens), len(s.windows)
}

// Begin implements idempotency.Store.
func (s *Store) Begin(ctx context.Context, r idempotency.BeginRequest) (idempotency.BeginResult, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.BeginResult{}, err
	}
	k := r.ID
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init(r.Now)
	rec := s.records[k]
	if rec != nil && !r.Now.Before(rec.expiresAt) {
		delete(s.records, k)
		rec = nil
	}
	switch {
	case rec == nil:
		if r.Token != nil {
			if _, err := s.bind(r.Token.Hash, r.Token.Subject, r.Token.Purpose, r.Token.Scope, r.Now, r.Now.Add(r.TTL)); err != nil {
				return idempotency.BeginResult{}, err
			}
		}
		rec = &entry{
			fp: r.Fingerprint, state: idempotency.InFlight,
			lease: s.newLease(), leaseUntil: r.Now.Add(r.Lease), expiresAt: r.Now.Add(r.TTL),
		}
		if r.Token != nil {
			rec.tokenHash = r.Token.Hash
		}
		s.records[k] = rec
		s.expireAt('r', k, rec.expiresAt)
		return idempotency.BeginResult{Outcome: idempotency.Started, Lease: rec.lease}, nil
	case rec.fp != r.Fingerprint:
		return idempotency.BeginResult{Outcome: idempotency.Mismatch, Record: rec.record(r.ID)}, nil
	case rec.state == idempotency.Completed:
		return idempotency.BeginResult{Outcome: idempotency.Replay, Record: rec.record(r.ID)}, nil
	case r.Now.Before(rec.leaseUntil):
		return idempotency.BeginResult{Outcome: idempotency.InProgress, Record: rec.record(r.ID)}, nil
	}
	// In flight, but its holder stopped renewing (crashed): take it over.
	rec.lease, rec.leaseUntil = s.newLease(), r.Now.Add(r.Lease)
	return idempotency.BeginResult{Outcome: idempotency.Started, Lease: rec.lease, Recovered: true}, nil
}

// Complete implements idempotency.Store. It keeps a copy of resp.
func (s *Store) Complete(ctx context.Context, id, lease string, resp idempotency.Response, now time.Time) error {
	k := id
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records[k]
	if rec == nil || rec.state != idempotency.InFlight || rec.lease != lease {
		return idempotency.ErrLeaseLost
	}
	rec.state, rec.lease = idempotency.Completed, ""
	rec.status, rec.body = resp.Status, append([]byte(nil), resp.Body...)
	rec.setHeader(resp.Header)
	return nil
}

// Abandon implements idempotency.Store.
func (s *Store) Abandon(ctx context.Context, id, lease string) error {
	k := id
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records[k]
	if rec == nil || rec.state != idempotency.InFlight || rec.lease != lease {
		return idempotency.ErrLeaseLost
	}
	delete(s.records, k)
	if rec.tokenHash != "" {
		if t := s.tokens[rec.tokenHash]; t != nil {
			t.rec.Scope = ""
			t.keep = t.rec.ExpiresAt
		}
	}
	return nil
}

// ClaimWindow implements idempotency.WindowStore.
func (s *Store) ClaimWindow(ctx context.Context, id, owner string, d time.Duration, now time.Time) (time.Duration, error) {
	k := id
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init(now)
	if w, ok := s.windows[k]; ok && now.Before(w.expires) {
		if w.owner == owner {
			return 0, nil
		}
		return w.expires.Sub(now), nil
	}
	s.windows[k] = window{owner: owner, expires: now.Add(d)}
	s.expireAt('w', k, now.Add(d))
	return 0, nil
}

// FreeWindow implements idempotency.WindowStore.
func (s *Store) FreeWindow(ctx context.Context, id, owner string) error {
	k := id
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.windows[k]; ok && w.owner == owner {
		delete(s.windows, k)
	}
	return nil
}

// PutToken implements token.Store.
func (s *Store) PutToken(ctx context.Context, r token.Record) error {
	k := r.Hash
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init(time.Now())
	s.tokens[k] = &tokenEntry{rec: r, keep: r.ExpiresAt}
	s.expireAt('t', k, r.ExpiresAt)
	return nil
}

// GetToken implements token.Store.
func (s *Store) GetToken(ctx context.Context, hash string) (token.Record, error) {
	k := hash
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tokens[k]
	if t == nil {
		return token.Record{}, token.ErrUnknown
	}
	return t.rec, nil
}

// BindToken implements token.Store. A token bound on its own (not through
// Begin) is kept for 24h after binding.
func (s *Store) BindToken(ctx context.Context, hash, subject, purpose, scope string, now time.Time) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bind(hash, subject, purpose, scope, now, now.Add(24*time.Hour))
}

func (s *Store) bind(hash, subject, purpose, scope string, now, keep time.Time) (bool, error) {
	k := hash
	t := s.tokens[k]
	if t == nil {
		return false, token.ErrUnknown
	}
	if err := t.rec.Check(subject, purpose, scope, now); err != nil {
		return false, err
	}
	if t.rec.Scope == scope {
		return false, nil
	}
	t.rec.Scope = scope
	t.keep = keep
	s.expireAt('t', k, keep)
	return true, nil
}

// UnbindToken implements token.Store.
func (s *Store) UnbindToken(ctx context.Context, hash, scope string) error {
	k := hash
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.tokens[k]; t != nil && t.rec.Scope == scope {
		t.rec.Scope = ""
		t.keep = t.rec.ExpiresAt
	}
	return nil
}

// newLease returns a random lease id: 16 bytes of a ChaCha8 stream seeded
// from crypto/rand (cryptographically strong, and without the allocation
// crypto/rand.Read costs), in unpadded base64url. s.mu is held.
func (s *Store) newLease() string {
	if s.leases == nil {
		var seed [32]byte
		_, _ = rand.Read(seed[:])
		s.leases = mrand.NewChaCha8(seed)
	}
	var b [16]byte
	_, _ = s.leases.Read(b[:])
	var out [22]byte // base64.RawURLEncoding.EncodedLen(16)
	base64.RawURLEncoding.Encode(out[:], b[:])
	return string(out[:])
}
