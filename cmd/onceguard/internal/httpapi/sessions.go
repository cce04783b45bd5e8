package httpapi

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
)

type credentials struct {
	Username *string `json:"username"`
	Password *string `json:"password"`
}

// readCredentials decodes {"username", "password"}, answering the problem when it cannot.
func (s *server) readCredentials(w http.ResponseWriter, r *http.Request) (string, string, bool) {
	body, p := ReadBody(r)
	if p == nil {
		var c credentials
		if p = Decode(body, &c); p == nil {
			switch {
			case c.Username == nil:
				p = Missing("username")
			case c.Password == nil:
				p = Missing("password")
			default:
				return *c.Username, *c.Password, true
			}
		}
	}
	writeProblem(w, p)
	return "", "", false
}

func (s *server) createUser(w http.ResponseWriter, r *http.Request) {
	name, pass, ok := s.readCredentials(w, r)
	if !ok {
		return
	}
	if err := app.CheckSignUp(name, pass); err != nil {
		s.fail(w, r, err)
		return
	}
	// Account spam: counted before the (slow) hash, like a sign-in, and
	// given back only when the attempt never got to create a user.
	signup := attempt{s.signups, s.clientAddr(r)}
	if wait := reserveAll(time.Now(), signup); wait > 0 {
		app.Logger(r.Context(), s.log).Warn("sign-up refused: too many sign-ups", "client", signup.key)
		tooMany(w, "too_many_signups", "too many accounts created from this address; wait before creating another", wait)
		return
	}
	u, err := s.app.SignUp(r.Context(), name, pass)
	if err != nil {
		if !errors.Is(err, app.ErrUsernameTaken) {
			undoAll(signup) // the hash was not spent, or the store failed: not the caller's doing
		}
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]string{"id": u.ID, "username": u.Username})
}

func (s *server) createSession(w http.ResponseWriter, r *http.Request) {
	name, pass, ok := s.readCredentials(w, r)
	if !ok {
		return
	}
	// Brute force: refused before the (slow) hash is even computed. Each
	// attempt is counted as a failure before it is made (and given back
	// when it succeeds), so that attempts sent at once cannot all pass a
	// check that only finished ones counted toward.
	addr, now := s.clientAddr(r), time.Now()
	refused := func(wait time.Duration) {
		app.Logger(r.Context(), s.log).Warn("sign-in refused: too many failed attempts", "username", logName(name), "client", addr)
		tooMany(w, "too_many_attempts", "too many failed sign-ins; wait before trying again", wait)
	}
	invalid := func() {
		app.Logger(r.Context(), s.log).Warn("sign-in refused", "username", logName(name), "client", addr)
		s.fail(w, r, app.ErrInvalidCreds)
	}
	if !app.ValidUsername(name) {
		// A name no user can have costs no hash and counts against the address only: a
		// counter per such name would let anyone fill the limiters with names of up to 64 KiB.
		if wait := reserveAll(now, attempt{s.loginAddr, addr}); wait > 0 {
			refused(wait)
			return
		}
		invalid()
		return
	}
	pair := name + "\x00" + addr
	if wait := s.loginPair.reserve(pair, now); wait > 0 {
		refused(wait)
		return
	}
	wait, n := s.loginAddr.reserveN(addr, now)
	if wait > 0 {
		s.loginPair.undo(pair)
		refused(wait)
		return
	}
	attempts := []attempt{{s.loginPair, pair}, {s.loginAddr, addr}}
	// The per-username limit stops guessers spread over many addresses,
	// but must not let them lock the owner out: an address with no other
	// failure (n counts this attempt, atomically) and a pair that signed in
	// before are counted by it but not refused.
	exempt := n == 1 || s.loginKnown.has(pair, now)
	if wait := s.loginUser.reserve(name, now); wait == 0 {
		attempts = append(attempts, attempt{s.loginUser, name})
	} else if !exempt {
		undoAll(attempts...)
		refused(wait)
		return
	}
	u, err := s.app.Authenticate(r.Context(), name, pass)
	switch {
	case errors.Is(err, app.ErrInvalidCreds):
		invalid() // the reservations stay: they were the failures
		return
	case err != nil:
		undoAll(attempts...) // busy, or the store failed: not the caller's failure
		s.fail(w, r, err)
		return
	}
	undoAll(attempts[1:]...) // this attempt was no failure
	s.loginPair.forget(pair) // and the pair's earlier ones are forgiven
	s.loginKnown.reserve(pair, now)
	sess, err := s.app.StartSession(r.Context(), u)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: sess.Token, Path: "/", Expires: sess.ExpiresAt, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.cfg.SecureCookies || secure(r)})
	writeJSON(w, http.StatusCreated, map[string]string{"token": sess.Token, "expires_at": sess.ExpiresAt.UTC().Format(time.RFC3339)})
}

// logName is a sign-in name as logged: as sent if a user could have it,
// else cut to 64 bytes and marked.
func logName(name string) string {
	if app.ValidUsername(name) {
		return name
	}
	if len(name) > 64 {
		name = name[:64] + "…"
	}
	return "(invalid) " + strconv.Quote(name)
}

func (s *server) deleteSession(w http.ResponseWriter, r *http.Request) {
	if err := s.app.EndSession(r.Context(), sessionToken(r)); err != nil {
		s.fail(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
}
