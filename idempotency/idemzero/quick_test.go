package idemzero_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// These quick tests run one real server of the framework each; the
// shared conformance suite (TestConformance) covers the rest.

func post(t *testing.T, url, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User", "alice")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// The handler sees the Call in its context and the whole body; a retry
// gets its answer byte for byte, marked, and it runs once.
func TestQuickReplay(t *testing.T) {
	var runs atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		principal := "no call"
		if call, ok := idempotency.FromContext(r.Context()); ok {
			principal = call.Scope.Principal
		}
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/vnd.pay+json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"run":%d,"principal":%q,"body":%s}`, n, principal, b)
	})
	url := start(t, config{Store: &memstore.Store{}}, app)
	first, b1 := post(t, url, "k1", `{"amount":"10.00"}`)
	again, b2 := post(t, url, "k1", `{"amount":"10.00"}`)
	const want = `{"run":1,"principal":"alice","body":{"amount":"10.00"}}`
	if first == nil || first.StatusCode != http.StatusCreated || b1 != want {
		t.Fatalf("first = %v %s; want 201 %s", first, b1, want)
	}
	if again == nil || again.StatusCode != http.StatusCreated || b2 != b1 || again.Header.Get("Idempotent-Replayed") != "true" ||
		again.Header.Get("Content-Type") != "application/vnd.pay+json" {
		t.Fatalf("retry = %v %s; want 201 %s, replayed, the first Content-Type", again, b2, b1)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times; want 1", n)
	}
}

// A retry while the first runs gets 409, the same key with another body
// 422, no key 400; none runs the handler.
func TestQuickRefusals(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	})
	url := start(t, config{Store: &memstore.Store{}}, app)
	done := make(chan int)
	go func() {
		resp, _ := post(t, url, "k1", `{"a":1}`)
		if resp == nil {
			done <- 0
			return
		}
		done <- resp.StatusCode
	}()
	<-entered
	for _, c := range []struct {
		name, key, body string
		status          int
		code            string
	}{
		{"in flight", "k1", `{"a":1}`, http.StatusConflict, "request_in_progress"},
		{"missing", "", `{"a":1}`, http.StatusBadRequest, "idempotency_key_missing"},
		{"invalid", "bad key", `{"a":1}`, http.StatusBadRequest, "idempotency_key_invalid"},
	} {
		resp, body := post(t, url, c.key, c.body)
		if resp == nil || resp.StatusCode != c.status || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, `"code":"`+c.code+`"`) {
			t.Errorf("%s: %v %s; want %d problem+json %s", c.name, resp, body, c.status, c.code)
		}
	}
	close(release)
	if got := <-done; got != http.StatusCreated {
		t.Fatalf("first = %d; want 201", got)
	}
	resp, body := post(t, url, "k1", `{"a":2}`)
	if resp == nil || resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, `"code":"idempotency_key_reused"`) {
		t.Errorf("other body: %v %s; want 422 idempotency_key_reused", resp, body)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times; want 1", n)
	}
}

// A handler that panics frees the key: its retry runs again.
func TestQuickPanicFreesKey(t *testing.T) {
	var runs atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			panic(errors.New("boom"))
		}
		w.WriteHeader(http.StatusCreated)
	})
	url := start(t, config{Store: &memstore.Store{}}, app)
	if resp, body := post(t, url, "k1", `{}`); resp != nil && resp.StatusCode < 500 {
		t.Fatalf("panicking handler answered %d %s; want a 5xx or no answer", resp.StatusCode, body)
	}
	if resp, body := post(t, url, "k1", `{}`); resp == nil || resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after the panic = %v %s; want a first 201", resp, body)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("handler ran %d times; want 2", n)
	}
}

// On a KeyOptional route a request without a key runs, unprotected (no
// Call in its context, told as "unprotected"), with its whole body; one
// with a key is guarded as always.
func TestQuickKeyOptional(t *testing.T) {
	var runs, unprotected atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		_, guarded := idempotency.FromContext(r.Context())
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "guarded=%v body=%s", guarded, b)
	})
	url := startKeyOptional(t, func() { unprotected.Add(1) }, app)
	for range 2 {
		if resp, body := post(t, url, "", `{"a":1}`); resp == nil || resp.StatusCode != http.StatusCreated || body != `guarded=false body={"a":1}` {
			t.Fatalf("no key = %v %q; want 201 guarded=false with the body", resp, body)
		}
	}
	for range 2 {
		if resp, body := post(t, url, "k1", `{"a":1}`); resp == nil || resp.StatusCode != http.StatusCreated || body != `guarded=true body={"a":1}` {
			t.Fatalf("a key = %v %q; want 201 guarded=true with the body", resp, body)
		}
	}
	if r, u := runs.Load(), unprotected.Load(); r != 3 || u != 2 {
		t.Errorf("%d runs, %d told unprotected; want 3 (two without a key, one with), 2", r, u)
	}
}
