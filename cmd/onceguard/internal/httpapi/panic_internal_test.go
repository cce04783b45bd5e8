package httpapi

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A handler that panics after its status went out cannot be answered 500
// any more: the response is aborted (http.ErrAbortHandler, which makes
// net/http break the connection), so the client sees a broken answer
// rather than a short one that looks whole, after the request's log line.
// http.ErrAbortHandler itself passes through untouched.
func TestPanicAfterStatusAborts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value any
	}{{"a bug", "bug"}, {"an abort", http.ErrAbortHandler}} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			s := &server{log: slog.New(slog.NewJSONHandler(&logs, nil)), routes: map[string]map[string]http.Handler{}}
			s.handle("GET", "/x", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusOK)
				_, _ = w.Write([]byte("part of it"))
				panic(tc.value)
			}))
			s.compose()
			defer func() {
				if v := recover(); v != http.ErrAbortHandler {
					t.Errorf("ServeHTTP panicked with %v; want http.ErrAbortHandler", v)
				}
				if tc.value == "bug" && (!strings.Contains(logs.String(), `"msg":"handler panicked"`) || !strings.Contains(logs.String(), `"status":500`)) {
					t.Errorf("want a 'handler panicked' line and a request line with status 500; logs:\n%s", logs.String())
				}
			}()
			s.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/x", nil))
			t.Error("ServeHTTP returned; want the response aborted")
		})
	}
}
