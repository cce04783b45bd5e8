package app

import (
	"context"
	"errors"
	"regexp"
	"sync"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/auth"
)

// usernameRE is what a username may be: lowercase, so that no database's collation matches another spelling.
var usernameRE = regexp.MustCompile(`^[a-z0-9_]{3,32}$`)

// ValidUsername reports whether a user could have name.
func ValidUsername(name string) bool { return usernameRE.MatchString(name) }

// CheckSignUp refuses a username or password that breaks the rules.
func CheckSignUp(name, password string) error {
	if !ValidUsername(name) {
		return &Error{Code: CodeInvalidUsername, Message: "3 to 32 of a-z, 0-9 and _"}
	}
	if len(password) < 8 || len(password) > 128 {
		return &Error{Code: CodeInvalidPassword, Message: "8 to 128 bytes"}
	}
	return nil
}

// ErrHashBusy: no password-hashing slot came free in time; nothing changed.
var ErrHashBusy = &Error{Code: CodeBusy, Message: "too many sign-ins and sign-ups at once; nothing changed, retry shortly"}

// hashWait bounds how long a sign-up or sign-in waits for a hashing slot.
const hashWait = 5 * time.Second

// hashing runs f, a password hash, once one of a few slots is free (as many as the scheduler's
// processors, at least 2): an argon2id hash holds 19 MiB while it runs and is CPU-bound, so a
// queue costs nothing and more at once would not finish sooner. ErrHashBusy after hashWait or
// when ctx ends first.
func (s *Service) hashing(ctx context.Context, f func()) error {
	select {
	case s.hashSlots <- struct{}{}:
	default:
		t := time.NewTimer(hashWait)
		defer t.Stop()
		select {
		case s.hashSlots <- struct{}{}:
		case <-t.C:
			return ErrHashBusy
		case <-ctx.Done():
			return ErrHashBusy
		}
	}
	defer func() { <-s.hashSlots }()
	f()
	return nil
}

// HoldHashSlots takes every hashing slot until release is called, so that sign-ups and
// sign-ins wait meanwhile. For tests.
func (s *Service) HoldHashSlots() (release func()) {
	n := cap(s.hashSlots)
	for range n {
		s.hashSlots <- struct{}{}
	}
	return func() {
		for range n {
			<-s.hashSlots
		}
	}
}

// SignUp creates a user with an empty account. Errors: those of CheckSignUp, ErrHashBusy,
// ErrUsernameTaken. Once the hash is spent the user is created even if ctx ends meanwhile,
// so that hanging up during the hash gets nothing back.
func (s *Service) SignUp(ctx context.Context, name, password string) (User, error) {
	if err := CheckSignUp(name, password); err != nil {
		return User{}, err
	}
	var hash string
	if err := s.hashing(ctx, func() { hash = auth.HashPassword(password) }); err != nil {
		return User{}, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RequestTimeout)
	defer cancel()
	u := User{ID: newID("u_"), Username: name, PasswordHash: hash, CreatedAt: time.Now()}
	if err := s.cfg.Store.CreateUser(ctx, u, s.cfg.Currency); err != nil {
		return User{}, err
	}
	return u, nil
}

var dummyHash = auth.HashPassword("timing equaliser, never a password")

// ErrLookup wraps a store failure to look a user up during Authenticate: not the caller's failure.
var ErrLookup = errors.New("app: looking the user up")

// Authenticate checks a username and password: ErrInvalidCreds for a wrong one or an unknown
// user (after the same hashing time), ErrHashBusy, or a store error wrapping ErrLookup.
func (s *Service) Authenticate(ctx context.Context, name, password string) (User, error) {
	if !ValidUsername(name) {
		return User{}, ErrInvalidCreds // no user has it, on any database: no hash spent
	}
	u, err := s.cfg.Store.UserByName(ctx, name)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return User{}, errors.Join(ErrLookup, err)
	}
	hash := u.PasswordHash
	if hash == "" {
		hash = dummyHash // the same time on unknown users
	}
	var perr error
	if herr := s.hashing(ctx, func() { perr = auth.CheckPassword(hash, password) }); herr != nil {
		return User{}, herr
	}
	if perr != nil || err != nil {
		return User{}, ErrInvalidCreds
	}
	return u, nil
}

// StartSession signs u in with a new token, whatever the request carried, so that a planted
// session never becomes authenticated.
func (s *Service) StartSession(ctx context.Context, u User) (Session, error) {
	tok, th := auth.NewSessionToken()
	now := time.Now()
	exp := now.Add(s.cfg.SessionTTL)
	if err := s.cfg.Store.CreateSession(ctx, th, u.ID, exp, now); err != nil {
		return Session{}, err
	}
	return Session{Token: tok, ExpiresAt: exp}, nil
}

// SessionUser returns the user a session token signs in; ErrNotFound for none, expired or ended.
// Every call reads the session, so an ended one is seen at once; its user, which never changes,
// comes from memory after the session's first request (SessionPrincipal's), and the read is
// then of the session's row alone.
func (s *Service) SessionUser(ctx context.Context, token string) (User, error) {
	if token == "" {
		return User{}, ErrNotFound
	}
	hash := auth.HashToken(token)
	if u, ok := s.sessions.get(hash); ok {
		if err := s.cfg.Store.SessionLive(ctx, hash, time.Now()); err != nil {
			if errors.Is(err, ErrNotFound) {
				s.sessions.drop(hash)
			}
			return User{}, err
		}
		return u, nil
	}
	return s.readSession(ctx, hash)
}

// SessionPrincipal returns the user of a session token as SessionUser does the first time, and
// from memory after that, with the token's hash: a session's user never changes, but the
// session may have ended since (on another instance, say), so a caller acts on it only in a
// transaction that checks the session is still live (TxChecks.SessionHash) and answers
// ErrSessionEnded when it is not. EndSession forgets it here at once.
func (s *Service) SessionPrincipal(ctx context.Context, token string) (User, string, error) {
	if token == "" {
		return User{}, "", ErrNotFound
	}
	hash := auth.HashToken(token)
	if u, ok := s.sessions.get(hash); ok {
		return u, hash, nil
	}
	u, err := s.readSession(ctx, hash)
	return u, hash, err
}

// readSession reads the user of the session with hash, and remembers it when it is live.
func (s *Service) readSession(ctx context.Context, hash string) (User, error) {
	u, err := s.cfg.Store.SessionUser(ctx, hash, time.Now())
	if err == nil {
		s.sessions.put(hash, u)
	}
	return u, err
}

// EndSession ends a session at once.
func (s *Service) EndSession(ctx context.Context, token string) error {
	hash := auth.HashToken(token)
	s.sessions.drop(hash)
	return s.cfg.Store.DeleteSession(ctx, hash)
}

// sessionCache maps session token hashes to their users: at most maxSessions, emptied when full.
type sessionCache struct {
	mu sync.RWMutex
	m  map[string]User
}

const maxSessions = 100_000

func (c *sessionCache) get(hash string) (User, bool) {
	c.mu.RLock()
	u, ok := c.m[hash]
	c.mu.RUnlock()
	return u, ok
}

func (c *sessionCache) put(hash string, u User) {
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxSessions {
		c.m = make(map[string]User)
	}
	c.m[hash] = u
	c.mu.Unlock()
}

func (c *sessionCache) drop(hash string) {
	c.mu.Lock()
	delete(c.m, hash)
	c.mu.Unlock()
}
