package idemclient

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Setting only MaxBackoff below DefaultMinBackoff/2 (a client that wants
// quick retries) must not make RoundTrip panic on the first retry.
func TestMaxBackoffBelowMinBackoff(t *testing.T) {
	srv, n := fixed(t, problem(503, "store_unavailable", ""), created)
	s := &noSleep{}
	c := &http.Client{Transport: &Transport{MaxBackoff: 10 * time.Millisecond, sleep: s.sleep}}
	defer func() {
		if v := recover(); v != nil {
			t.Fatalf("RoundTrip panicked: %v", v)
		}
	}()
	resp, _ := post(t, c, srv.URL, `{}`)
	if resp.StatusCode != http.StatusCreated || n.Load() != 2 {
		t.Fatalf("got %d after %d attempts; want 201 after 2", resp.StatusCode, n.Load())
	}
}

// An attempt whose outcome is unknown (the connection was lost after the
// request was sent), then a retry whose body cannot be made again: the
// error must still carry the key (the package's promise), since the first
// attempt may have run.
func TestGetBodyFailureKeepsKey(t *testing.T) {
	var calls atomic.Int32
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, r.Body)
		return nil, errors.New("connection reset by peer")
	})
	tr := &Transport{Base: base, sleep: (&noSleep{}).sleep}
	req, _ := http.NewRequest(http.MethodPost, "http://example.invalid/pay", strings.NewReader(`{}`))
	req.GetBody = func() (io.ReadCloser, error) {
		if calls.Add(1) > 1 {
			return nil, errors.New("body source gone")
		}
		return io.NopCloser(strings.NewReader(`{}`)), nil
	}
	_, err := tr.RoundTrip(req)
	var e *Error
	if !errors.As(err, &e) || e.Key == "" || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("err = %v (%T); want an *Error carrying the key (outcome unknown)", err, err)
	}
}
