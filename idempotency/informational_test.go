package idempotency_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/idempotency"
	"github.com/onceguard/onceguard/idempotency/memstore"
)

// A handler that sends an informational answer first (103 Early Hints,
// which net/http sends at once and does not count as the answer) and then
// its real one: the answer is the second status, first and on replay.
func TestInformationalStatusNotTheAnswer(t *testing.T) {
	h := idempotency.Middleware(idempotency.Config{Store: &memstore.Store{}})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload; as=style")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "made")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	send := func() (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "k103")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := send(); code != http.StatusCreated || body != "made" {
		t.Errorf("first answer = %d %q; want 201 \"made\"", code, body)
	}
	if code, body := send(); code != http.StatusCreated || body != "made" {
		t.Errorf("replay = %d %q; want 201 \"made\"", code, body)
	}
}
