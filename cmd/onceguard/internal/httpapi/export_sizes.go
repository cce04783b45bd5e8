package httpapi

import "net/http"

// MaxLimiterEntries is the most keys each in-memory limiter keeps (the
// per-address token buckets, the three failed-sign-in counters and the
// sign-up counter).
const MaxLimiterEntries = maxLimiterEntries

// LimiterSizes is how many keys a service's in-memory limiters hold.
type LimiterSizes struct {
	Rates     int // token buckets, one per client address
	LoginPair int // failed sign-ins per (username, address)
	LoginAddr int // failed sign-ins per address
	LoginUser int // failed sign-ins per username
	Signups   int // sign-ups per address
}

// Sizes reports the limiters of h, a handler from New (ok is false for
// any other handler). For tests: the soak checks them against
// MaxLimiterEntries.
func Sizes(h http.Handler) (z LimiterSizes, ok bool) {
	s, ok := h.(*server)
	if !ok {
		return z, false
	}
	if r := s.rates; r != nil {
		r.mu.Lock()
		z.Rates = len(r.m)
		r.mu.Unlock()
	}
	for _, c := range []struct {
		f *failures
		n *int
	}{{s.loginPair, &z.LoginPair}, {s.loginAddr, &z.LoginAddr}, {s.loginUser, &z.LoginUser}, {s.signups, &z.Signups}} {
		if c.f != nil {
			*c.n = c.f.size()
		}
	}
	return z, true
}

// HoldHashSlots takes every password-hashing slot of h, a handler from
// New, until release is called: sign-ups and sign-ins meanwhile wait for
// one, and answer 503 busy when their request ends first. For tests.
func HoldHashSlots(h http.Handler) (release func(), ok bool) {
	s, ok := h.(*server)
	if !ok {
		return nil, false
	}
	return s.app.HoldHashSlots(), true
}
