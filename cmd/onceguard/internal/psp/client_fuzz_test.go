package psp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
)

// answer is a canned provider answer, served without a network.
type answer struct {
	status int
	body   []byte
}

func (a answer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{StatusCode: a.status, Status: http.StatusText(a.status), Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(bytes.NewReader(a.body)), ContentLength: int64(len(a.body)), Request: r}, nil
}

// FuzzClientResponse feeds the provider client arbitrary answers (status
// code and body) to Do and Lookup. It must never panic, and it may return
// an Operation only for a 200 whose body is exactly one operation for the
// key asked (and, from Do, of the kind and amount asked) with a known
// status. Anything else is an error: a garbled 200 is ErrUnknownOutcome,
// so the movement stays pending and is asked about again, never settled
// on an answer nobody can read (once {} settled a payout as failed).
func FuzzClientResponse(f *testing.F) {
	good := func(key string, kind psp.Kind, amount, status string) []byte {
		return []byte(`{"id":"op_1","key":"` + key + `","kind":"` + string(kind) + `","amount":"` + amount + `","status":"` + status + `","created_at":"2026-01-02T03:04:05Z"}` + "\n")
	}
	for _, s := range []struct {
		do     bool
		status int
		body   []byte
	}{
		{true, 200, good("wd_1", psp.Payout, "10.00", "succeeded")},
		{true, 200, good("wd_1", psp.Payout, "10.00", "failed")},
		{false, 200, good("wd_1", psp.Payout, "10.00", "succeeded")},
		{true, 200, good("wd_1", psp.Charge, "10.00", "succeeded")},
		{true, 200, good("wd_2", psp.Payout, "10.00", "succeeded")},
		{true, 200, good("wd_1", psp.Payout, "10.01", "succeeded")},
		{true, 200, good("wd_1", psp.Payout, "10.00", "pending")},
		{true, 200, []byte(`{}`)},
		{true, 200, []byte(`null`)},
		{true, 200, []byte(``)},
		{true, 200, []byte(`[]`)},
		{true, 200, []byte(`{"status":"succeeded"}`)},
		{true, 200, append(good("wd_1", psp.Payout, "10.00", "succeeded"), `{"status":"failed"}`...)},
		{true, 200, []byte(`{"id":"op_1","key":"wd_1","kind":"payout","amount":1e400,"status":"succeeded"}`)},
		{true, 200, []byte(`{"id":"op_1","key":"wd_1","kind":"payout","amount":"10.00","status":"succeeded","created_at":"yesterday"}`)},
		{false, 404, []byte("psp: no operation with that key\n")},
		{true, 409, []byte("psp: idempotency key reused\n")},
		{true, 400, nil},
		{true, 302, nil},
		{true, 500, good("wd_1", psp.Payout, "10.00", "succeeded")},
		{true, 504, []byte("timeout")},
	} {
		f.Add(s.do, s.status, s.body)
	}
	const key, kind, amount = "wd_1", psp.Payout, money.Amount(1000)
	f.Fuzz(func(t *testing.T, do bool, status int, body []byte) {
		if status < 200 || status > 599 { // 1xx are interim answers to Go's client
			status = 200 + (status%400+400)%400
		}
		c := psp.NewClient("http://psp.invalid", &http.Client{Transport: answer{status, body}, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}})
		var (
			op  psp.Operation
			err error
		)
		if do {
			op, err = c.Do(context.Background(), kind, key, amount)
		} else {
			op, err = c.Lookup(context.Background(), key)
		}

		// What the answer must be, decided independently of the client.
		var want struct {
			psp.Operation
			ok bool
		}
		if status == 200 {
			var ref psp.Operation
			if len(body) <= 64<<10 && json.Unmarshal(body, &ref) == nil && bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("{")) &&
				ref.ID != "" && ref.Key == key && (ref.Status == psp.Succeeded || ref.Status == psp.Failed || ref.Status == psp.Pending) &&
				(ref.Kind == psp.Charge || ref.Kind == psp.Payout) && ref.Amount > 0 &&
				(!do || ref.Kind == kind && ref.Amount == amount) {
				want.Operation, want.ok = ref, true
			}
		}
		switch {
		case want.ok:
			if err != nil || !sameOperation(op, want.Operation) {
				t.Fatalf("200 %q: %+v, %v; want %+v", body, op, err, want.Operation)
			}
		case err == nil:
			t.Fatalf("%d %q: accepted as %+v; want an error", status, body, op)
		case !sameOperation(op, psp.Operation{}):
			t.Fatalf("%d %q: error %v with a non-zero operation %+v", status, body, err, op)
		case status == 200 || status >= 500:
			if !errors.Is(err, psp.ErrUnknownOutcome) {
				t.Fatalf("%d %q: %v; want ErrUnknownOutcome", status, body, err)
			}
		case status == 404:
			if !errors.Is(err, psp.ErrNotFound) {
				t.Fatalf("404: %v; want ErrNotFound", err)
			}
		case status == 409:
			if !errors.Is(err, psp.ErrKeyReused) {
				t.Fatalf("409: %v; want ErrKeyReused", err)
			}
		default:
			if !errors.Is(err, psp.ErrInvalid) {
				t.Fatalf("%d: %v; want ErrInvalid", status, err)
			}
		}
	})
}

func sameOperation(a, b psp.Operation) bool {
	return a.ID == b.ID && a.Key == b.Key && a.Kind == b.Kind && a.Amount == b.Amount && a.Status == b.Status && a.CreatedAt.Equal(b.CreatedAt)
}
