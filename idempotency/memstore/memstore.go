// Package memstore keeps idempotency records, submit tokens and the
// repeat-submit window in process memory, under one mutex, so binding a
// token and creating a key's record are one atomic step. For tests and
// single-process programs; it forgets everything on restart.
//
// Memory stays bounded: every write first drops what has expired, found
// through deadlines filed by the second (see expiry). A record is one allocation
// (its lease id and a completed answer's body are the others), so a
// request allocates little.
package memstore

import (
	"context"
	"crypto/rand"
	"hash/maphash"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/token"
)

// Store implements idemstore.FullStore. A zero Store is ready to use; it
// must not be copied after first use. It is safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	records recordMap
	tokens  map[string]*tokenEntry
	windows map[string]window
	expiry  expiry         // when each record, token and window entry may go
	leases  *mrand.ChaCha8 // lease ids, seeded from crypto/rand
}

// entry is a key's record, with its answer once completed: the fields of
// an idemstore.Record, in one allocation with room for its lease and a
// header of one value. Times are Unix nanoseconds: no pointer to a
// time.Location per record. What few records need is in more, so that a
// record fits a 160-byte size class.
type entry struct {
	id         string
	h          uint64 // the id's hash in the record map
	fp         string
	leaseUntil int64
	expiresAt  int64
	tokenHash  string

	// Completed: the answer.
	body   []byte
	inline [2]string // the header's one pair (one is set), else more.pairs
	more   *more     // made for a take-over, a rare header or the first replay

	status   int32
	state    uint8 // an idemstore.State
	noHdr    bool  // the header was nil
	one      bool  // the header's one pair is inline
	gone     bool  // removed from the record map: its deadline is void
	leaseBuf [leaseLen]byte
}

// more is what few entries need.
type more struct {
	lease  string            // a take-over's lease ("": leaseBuf's, see curLease)
	pairs  []string          // the header's name, value pairs, each name's together
	bare   []bare            // header names without values
	replay *idemstore.Record // made on the first replay
}

func (e *entry) ensureMore() *more {
	if e.more == nil {
		e.more = new(more)
	}
	return e.more
}

type bare struct {
	name  string
	isNil bool
}

// record returns e as an idemstore.Record. A completed entry no longer
// changes: its Record is made once, on its first replay, and shared by
// every replay after it (read-only, as Store.Begin says).
func (e *entry) record(id string) *idemstore.Record {
	if e.more != nil && e.more.replay != nil {
		return e.more.replay
	}
	c := &struct {
		rec  idemstore.Record
		resp idemstore.Response
	}{rec: idemstore.Record{
		ID: id, Fingerprint: e.fp, State: idemstore.State(e.state), Lease: e.curLease(),
		LeaseUntil: time.Unix(0, e.leaseUntil), ExpiresAt: time.Unix(0, e.expiresAt), TokenHash: e.tokenHash,
	}}
	if e.state == completed {
		c.resp = idemstore.Response{Status: int(e.status), Header: e.header(), Body: e.body}
		c.rec.Response = &c.resp
		e.ensureMore().replay = &c.rec
	}
	return &c.rec
}

func (e *entry) setHeader(h http.Header) {
	if h == nil {
		e.noHdr = true
		return
	}
	// One value (the common case) is kept inline: no slice pointing into
	// the entry, for the collector to follow back to it.
	for k, vs := range h {
		if len(vs) == 0 {
			m := e.ensureMore()
			m.bare = append(m.bare, bare{name: k, isNil: vs == nil})
		}
		for _, v := range vs {
			switch {
			case e.more != nil && e.more.pairs != nil:
				e.more.pairs = append(e.more.pairs, k, v)
			case e.one:
				e.ensureMore().pairs = append(make([]string, 0, 4), e.inline[0], e.inline[1], k, v)
				e.one, e.inline = false, [2]string{}
			default:
				e.inline, e.one = [2]string{k, v}, true
			}
		}
	}
}

// pairList returns the header's name, value pairs.
func (e *entry) pairList() []string {
	switch {
	case e.one:
		return e.inline[:]
	case e.more != nil:
		return e.more.pairs
	}
	return nil
}

// curLease returns the lease of an entry in flight: a take-over's own
// string, or the one written into leaseBuf (a string over it, made
// without a pointer kept in the entry).
func (e *entry) curLease() string {
	switch {
	case e.state != inFlight:
		return ""
	case e.more != nil && e.more.lease != "":
		return e.more.lease
	}
	return unsafe.String(&e.leaseBuf[0], leaseLen)
}

func (e *entry) header() http.Header {
	if e.noHdr {
		return nil
	}
	var bares []bare
	if e.more != nil {
		bares = e.more.bare
	}
	pairs := e.pairList()
	names := len(bares)
	for i := 0; i < len(pairs); i += 2 {
		if i == 0 || pairs[i] != pairs[i-2] {
			names++
		}
	}
	h := make(http.Header, names)
	values := make([]string, len(pairs)/2)
	for i, j := 0, 0; i < len(pairs); {
		name, start := pairs[i], j
		for ; i < len(pairs) && pairs[i] == name; i, j = i+2, j+1 {
			values[j] = pairs[i+1]
		}
		h[name] = values[start:j:j]
	}
	for _, b := range bares {
		if b.isNil {
			h[b.name] = nil
		} else {
			h[b.name] = []string{}
		}
	}
	return h
}

// deadline says that the token or window entry k may be dropped, if its
// own time has come (a later write may have extended it). A record's
// deadline is a pointer to it (bucket.recs): a sweep reads neither its id
// nor the map to find it, and files it in 8 bytes.
type deadline struct {
	k    string // a token's or window entry's id
	kind byte   // 't' token, 'w' window
}

// expiry files deadlines by the second after the one they fall in: a
// push is an append to the current second's bucket (deadlines of one TTL
// arrive in order, so almost always the bucket of the push before), and
// a sweep takes the due buckets whole, in order, through a min-heap of
// their seconds. No per-deadline heap work and no time.Time per entry.
type expiry struct {
	buckets map[int64]*bucket
	seconds []int64 // min-heap of the keys of buckets
	last    int64   // the second of the last push...
	lastB   *bucket // ...and its bucket
	n       int     // deadlines filed
}

// bucket is one second's deadlines: its records' and its other entries'.
type bucket struct {
	recs chunks[*entry]
	keys chunks[deadline]
}

// chunks is a list in chunks of a fixed size: a busy second's bucket grows
// without copying what it holds.
type chunks[T any] struct {
	c []*[chunkLen]T
	n int
}

const chunkLen = 128

func (l *chunks[T]) add(x T) {
	if l.n%chunkLen == 0 {
		l.c = append(l.c, new([chunkLen]T))
	}
	l.c[l.n/chunkLen][l.n%chunkLen] = x
	l.n++
}

// each calls f for every element of l, in order.
func (l *chunks[T]) each(f func(T)) {
	for i, c := range l.c {
		for _, x := range c[:min(chunkLen, l.n-i*chunkLen)] {
			f(x)
		}
	}
}

func (e *expiry) push(d deadline, at time.Time) {
	e.bucket(at).keys.add(d)
	e.n++
}

func (e *expiry) pushRecord(r *entry, at time.Time) {
	e.bucket(at).recs.add(r)
	e.n++
}

// bucket returns the bucket of deadlines at.
func (e *expiry) bucket(at time.Time) *bucket {
	sec := at.Unix() + 1 // due once now >= sec, which is after at
	if e.lastB == nil || sec != e.last {
		b := e.buckets[sec]
		if b == nil {
			if e.buckets == nil {
				e.buckets = make(map[int64]*bucket)
			}
			b = new(bucket)
			e.buckets[sec] = b
			e.pushSecond(sec)
		}
		e.last, e.lastB = sec, b
	}
	return e.lastB
}

// due removes and returns the next bucket due at now, or nil.
func (e *expiry) due(now time.Time) *bucket {
	if len(e.seconds) == 0 || now.Unix() < e.seconds[0] {
		return nil
	}
	sec := e.popSecond()
	b := e.buckets[sec]
	delete(e.buckets, sec)
	if e.last == sec {
		e.lastB = nil
	}
	e.n -= b.recs.n + b.keys.n
	return b
}

func (e *expiry) pushSecond(sec int64) {
	e.seconds = append(e.seconds, sec)
	h := e.seconds
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if h[i] >= h[p] {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (e *expiry) popSecond() int64 {
	h := e.seconds
	x := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && h[l] < h[m] {
			m = l
		}
		if r := l + 1; r < n && h[r] < h[m] {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	e.seconds = h
	return x
}

func (s *Store) expireAt(kind byte, k string, at time.Time) {
	s.expiry.push(deadline{k: k, kind: kind}, at)
}

// recordMap maps record ids to entries. Its Go map is keyed by a seeded
// 64-bit hash of the id, so the table holds no strings: a lookup reads no
// id but the matching entry's, a growing table rehashes integers, and the
// collector has fewer pointers to follow. Two ids of one hash (about one
// pair in 10^10 among 100 000 records) are not lost: the later one goes
// to the overflow map, keyed by its id.
type recordMap struct {
	seed     maphash.Seed
	m        map[uint64]*entry
	overflow map[string]*entry
	n        int
	hash     func(string) uint64 // for tests: nil is maphash with seed
}

func (rm *recordMap) init() {
	rm.seed, rm.m = maphash.MakeSeed(), make(map[uint64]*entry)
}

// slot is where get looked for an id: its hash, and whether the main
// map held an entry (the id's or another's) under it.
type slot struct {
	h     uint64
	taken bool
}

// get returns where id goes and its entry, or nil.
func (rm *recordMap) get(id string) (slot, *entry) {
	if rm.m == nil {
		return slot{}, nil
	}
	var h uint64
	if rm.hash != nil {
		h = rm.hash(id)
	} else {
		h = maphash.String(rm.seed, id)
	}
	e := rm.m[h]
	if e != nil && e.id == id {
		return slot{h, true}, e
	}
	if len(rm.overflow) > 0 {
		return slot{h, e != nil}, rm.overflow[id]
	}
	return slot{h, e != nil}, nil
}

// put adds e, whose id is not in rm, where get found no entry for it
// (a del since then may have freed the slot; nothing else changes it).
// An empty slot is filled without looking it up again.
func (rm *recordMap) put(sl slot, e *entry) {
	e.h = sl.h
	if sl.taken && rm.m[sl.h] != nil {
		if rm.overflow == nil {
			rm.overflow = make(map[string]*entry)
		}
		rm.overflow[e.id] = e
	} else {
		rm.m[sl.h] = e
	}
	rm.n++
}

// del removes e, which is in rm.
func (rm *recordMap) del(e *entry) {
	if rm.m[e.h] == e {
		delete(rm.m, e.h)
	} else {
		delete(rm.overflow, e.id)
	}
	e.gone = true
	rm.n--
}

type tokenEntry struct {
	rec  token.Record
	keep time.Time // a bound token is kept as long as its record
}

type window struct {
	owner   string
	expires time.Time
}

var _ idemstore.FullStore = (*Store)(nil)

func (s *Store) init(now time.Time) {
	if s.tokens == nil {
		s.records.init()
		s.tokens = make(map[string]*tokenEntry)
		s.windows = make(map[string]window)
	}
	for b := s.expiry.due(now); b != nil; b = s.expiry.due(now) {
		b.recs.each(func(r *entry) {
			if !r.gone && now.UnixNano() >= r.expiresAt {
				s.records.del(r)
			}
		})
		b.keys.each(func(d deadline) {
			switch d.kind {
			case 't':
				if t := s.tokens[d.k]; t != nil && !now.Before(t.keep) {
					delete(s.tokens, d.k)
				}
			case 'w':
				if w, ok := s.windows[d.k]; ok && !now.Before(w.expires) {
					delete(s.windows, d.k)
				}
			}
		})
	}
}

// Len returns how many records, tokens and window entries are kept.
func (s *Store) Len() (records, tokens, windows int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.records.n, len(s.tokens), len(s.windows)
}

// Begin implements idemstore.Store.
func (s *Store) Begin(ctx context.Context, r idemstore.BeginRequest) (idemstore.BeginResult, error) {
	if err := ctx.Err(); err != nil {
		return idemstore.BeginResult{}, err
	}
	k := r.ID
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init(r.Now)
	now := r.Now.UnixNano()
	sl, rec := s.records.get(k)
	if rec != nil && now >= rec.expiresAt {
		s.records.del(rec)
		rec = nil
	}
	switch {
	case rec == nil:
		if r.Token != nil {
			if _, err := s.bind(r.Token.Hash, r.Token.Subject, r.Token.Purpose, r.Token.Scope, r.Now, r.Now.Add(r.TTL)); err != nil {
				return idemstore.BeginResult{}, err
			}
		}
		rec = &entry{id: k, fp: r.Fingerprint, state: inFlight, leaseUntil: now + int64(r.Lease), expiresAt: now + int64(r.TTL)}
		lease := s.newLease(&rec.leaseBuf)
		if r.Token != nil {
			rec.tokenHash = r.Token.Hash
		}
		s.records.put(sl, rec)
		s.expiry.pushRecord(rec, r.Now.Add(r.TTL))
		return idemstore.BeginResult{Outcome: idemstore.Started, Lease: lease}, nil
	case rec.fp != r.Fingerprint:
		return idemstore.BeginResult{Outcome: idemstore.Mismatch, Record: rec.record(r.ID)}, nil
	case rec.state == completed:
		return idemstore.BeginResult{Outcome: idemstore.Replay, Record: rec.record(r.ID)}, nil
	case now < rec.leaseUntil:
		return idemstore.BeginResult{Outcome: idemstore.InProgress, Record: rec.record(r.ID)}, nil
	}
	// In flight, but its holder stopped renewing (crashed): take it over.
	// A string of its own: the crashed holder's lease, which aliases
	// leaseBuf, must keep its value (and stop matching).
	var buf [leaseLen]byte
	lease := strings.Clone(s.newLease(&buf))
	rec.ensureMore().lease, rec.leaseUntil = lease, now+int64(r.Lease)
	return idemstore.BeginResult{Outcome: idemstore.Started, Lease: lease, Recovered: true}, nil
}

// Complete implements idemstore.Store. It keeps a copy of resp.
func (s *Store) Complete(ctx context.Context, id, lease string, resp idemstore.Response, now time.Time) error {
	k := id
	s.mu.Lock()
	defer s.mu.Unlock()
	_, rec := s.records.get(k)
	if rec == nil || rec.state != inFlight || rec.curLease() != lease {
		return idempotency.ErrLeaseLost
	}
	rec.state = completed // curLease is "" from now on
	rec.status, rec.body = int32(resp.Status), append([]byte(nil), resp.Body...)
	rec.setHeader(resp.Header)
	return nil
}

// Abandon implements idemstore.Store.
func (s *Store) Abandon(ctx context.Context, id, lease string) error {
	k := id
	s.mu.Lock()
	defer s.mu.Unlock()
	_, rec := s.records.get(k)
	if rec == nil || rec.state != inFlight || rec.curLease() != lease {
		return idempotency.ErrLeaseLost
	}
	s.records.del(rec)
	if rec.tokenHash != "" {
		if t := s.tokens[rec.tokenHash]; t != nil {
			t.rec.Scope = ""
			t.keep = t.rec.ExpiresAt
		}
	}
	return nil
}

// ClaimWindow implements idemstore.WindowStore.
func (s *Store) ClaimWindow(ctx context.Context, id, owner string, d time.Duration, now time.Time) (time.Duration, error) {
	k := id
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init(now)
	if w, ok := s.windows[k]; ok && now.Before(w.expires) {
		if w.owner == owner {
			return 0, nil
		}
		if idemstore.WindowRecord(w.owner) == idemstore.WindowRecord(owner) {
			s.windows[k] = window{owner: owner, expires: w.expires}
			return 0, nil
		}
		// At most d: a request that started before the winner's sees more.
		return min(w.expires.Sub(now), d), nil
	}
	s.windows[k] = window{owner: owner, expires: now.Add(d)}
	s.expireAt('w', k, now.Add(d))
	return 0, nil
}

// FreeWindow implements idemstore.WindowStore.
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
	return s.bind(hash, subject, purpose, scope, now, now.Add(token.BoundTTL))
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

// The states of an entry, as idemstore.State values in a byte.
const (
	inFlight  = uint8(idemstore.InFlight)
	completed = uint8(idemstore.Completed)
)

// leaseLen is the length of a lease id: 8 random bytes in hex.
const leaseLen = 16

// newLease writes a random lease id into buf and returns it as a string
// over buf (no allocation: buf is the record's, and is never written
// again). 64 bits of a ChaCha8 stream seeded from crypto/rand: a lease
// only has to differ from the one it replaces, and never leaves the
// process, and a word of the stream in hex costs a fraction of 16 bytes
// in base64 (or of crypto/rand.Read's allocation). s.mu is held.
func (s *Store) newLease(buf *[leaseLen]byte) string {
	if s.leases == nil {
		var seed [32]byte
		_, _ = rand.Read(seed[:])
		s.leases = mrand.NewChaCha8(seed)
	}
	const digits = "0123456789abcdef"
	x := s.leases.Uint64()
	for i := leaseLen - 1; i >= 0; i-- {
		buf[i] = digits[x&15]
		x >>= 4
	}
	return unsafe.String(&buf[0], leaseLen)
}
