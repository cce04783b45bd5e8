// Package memstore keeps idempotency records, submit tokens and the
// repeat-submit window in process memory, under one mutex, so binding a
// token and creating a key's record are one atomic step. For tests and
// single-process programs; it forgets everything on restart.
//
// Memory stays bounded: every write first drops what has expired, found
// in O(log n) through a min-heap of deadlines.
package memstore

import (
	"container/heap"
	"context"
	"crypto/rand"
	"encoding/base64"
	"sync"
	"time"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/token"
)

// Store implements idempotency.FullStore. A zero Store is ready to use; it
// must not be copied after first use. It is safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	records map[string]*idempotency.Record
	tokens  map[string]*tokenEntry
	windows map[string]window
	expiry  deadlines // when each record, token and window entry may go
}

// deadline says that the entry id of a kind may be dropped at at, if it
// still has that deadline (a later write may have extended it).
type deadline struct {
	at   time.Time
	kind byte // 'r' record, 't' token, 'w' window
	id   string
}

type deadlines []deadline

func (d deadlines) Len() int           { return len(d) }
func (d deadlines) Less(i, j int) bool { return d[i].at.Before(d[j].at) }
func (d deadlines) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *deadlines) Push(x any)        { *d = append(*d, x.(deadline)) }
func (d *deadlines) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}

func (s *Store) expireAt(kind byte, id string, at time.Time) {
	heap.Push(&s.expiry, deadline{at: at, kind: kind, id: id})
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
		s.records = make(map[string]*idempotency.Record)
		s.tokens = make(map[string]*tokenEntry)
		s.windows = make(map[string]window)
	}
	for len(s.expiry) > 0 && !now.Before(s.expiry[0].at) {
		d := heap.Pop(&s.expiry).(deadline)
		switch d.kind {
		case 'r':
			if r := s.records[d.id]; r != nil && !now.Before(r.ExpiresAt) {
				delete(s.records, d.id)
			}
		case 't':
			if t := s.tokens[d.id]; t != nil && !now.Before(t.keep) {
				delete(s.tokens, d.id)
			}
		case 'w':
			if w, ok := s.windows[d.id]; ok && !now.Before(w.expires) {
				delete(s.windows, d.id)
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
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init(r.Now)
	rec := s.records[r.ID]
	if rec != nil && !r.Now.Before(rec.ExpiresAt) {
		delete(s.records, r.ID)
		rec = nil
	}
	switch {
	case rec == nil:
		if r.Token != nil {
			if _, err := s.bind(r.Token.Hash, r.Token.Subject, r.Token.Purpose, r.Token.Scope, r.Now, r.Now.Add(r.TTL)); err != nil {
				return idempotency.BeginResult{}, err
			}
		}
		lease := newLease()
		rec = &idempotency.Record{
			ID: r.ID, Fingerprint: r.Fingerprint, State: idempotency.InFlight,
			Lease: lease, LeaseUntil: r.Now.Add(r.Lease), ExpiresAt: r.Now.Add(r.TTL),
		}
		if r.Token != nil {
			rec.TokenHash = r.Token.Hash
		}
		s.records[r.ID] = rec
		s.expireAt('r', r.ID, rec.ExpiresAt)
		return idempotency.BeginResult{Outcome: idempotency.Started, Lease: lease}, nil
	case rec.Fingerprint != r.Fingerprint:
		return idempotency.BeginResult{Outcome: idempotency.Mismatch, Record: copyRecord(rec)}, nil
	case rec.State == idempotency.Completed:
		return idempotency.BeginResult{Outcome: idempotency.Replay, Record: copyRecord(rec)}, nil
	case r.Now.Before(rec.LeaseUntil):
		return idempotency.BeginResult{Outcome: idempotency.InProgress, Record: copyRecord(rec)}, nil
	}
	// In flight, but its holder stopped renewing (crashed): take it over.
	rec.Lease, rec.LeaseUntil = newLease(), r.Now.Add(r.Lease)
	return idempotency.BeginResult{Outcome: idempotency.Started, Lease: rec.Lease, Recovered: true}, nil
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, id, lease string, resp idempotency.Response, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records[id]
	if rec == nil || rec.State != idempotency.InFlight || rec.Lease != lease {
		return idempotency.ErrLeaseLost
	}
	rec.State, rec.Lease = idempotency.Completed, ""
	rec.Response = &idempotency.Response{Status: resp.Status, Header: resp.Header.Clone(), Body: append([]byte(nil), resp.Body...)}
	return nil
}

// Abandon implements idempotency.Store.
func (s *Store) Abandon(ctx context.Context, id, lease string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.records[id]
	if rec == nil || rec.State != idempotency.InFlight || rec.Lease != lease {
		return idempotency.ErrLeaseLost
	}
	delete(s.records, id)
	if t := s.tokens[rec.TokenHash]; rec.TokenHash != "" && t != nil {
		t.rec.Scope = ""
		t.keep = t.rec.ExpiresAt
	}
	return nil
}

// ClaimWindow implements idempotency.WindowStore.
func (s *Store) ClaimWindow(ctx context.Context, id, owner string, d time.Duration, now time.Time) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init(now)
	if w, ok := s.windows[id]; ok && now.Before(w.expires) {
		if w.owner == owner {
			return 0, nil
		}
		return w.expires.Sub(now), nil
	}
	s.windows[id] = window{owner: owner, expires: now.Add(d)}
	s.expireAt('w', id, now.Add(d))
	return 0, nil
}

// FreeWindow implements idempotency.WindowStore.
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
	s.expireAt('t', r.Hash, r.ExpiresAt)
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
// Begin) is kept for 24h after binding.
func (s *Store) BindToken(ctx context.Context, hash, subject, purpose, scope string, now time.Time) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bind(hash, subject, purpose, scope, now, now.Add(24*time.Hour))
}

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
	t.rec.Scope = scope
	t.keep = keep
	s.expireAt('t', hash, keep)
	return true, nil
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

func copyRecord(r *idempotency.Record) *idempotency.Record {
	c := *r
	if r.Response != nil {
		resp := *r.Response
		resp.Header = r.Response.Header.Clone()
		c.Response = &resp
	}
	return &c
}

func newLease() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
