package httpapi

import "net/http"

// MaxLimiterEntries is the most keys each in-memory limiter keeps (the
// per-address token buckets and the three failed-sign-in counters).
const MaxLimiterEntries = maxLimiterEntries

// LimiterSizes is how many keys a service's in-memory limiters hold.
type LimiterSizes struct {
	Rates     int // token buckets, one per client address
	LoginPair int // failed sign-ins per (username, address)
	LoginAddr int // failed sign-ins per address
	LoginUser int // failed sign-ins per username
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
	}{{s.loginPair, &z.LoginPair}, {s.loginAddr, &z.LoginAddr}, {s.loginUser, &z.LoginUser}} {
		if c.f != nil {
			*c.n = c.f.size()
		}
	}
	return z, true
}
