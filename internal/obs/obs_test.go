package obs

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHash(t *testing.T) {
	if Hash("") != "" {
		t.Errorf(`Hash("") = %q; want ""`, Hash(""))
	}
	a, b := Hash("st_secret"), Hash("st_secret2")
	if len(a) != 12 || a == b || strings.Contains(a, "secret") || Hash("st_secret") != a {
		t.Errorf("Hash = %q, %q; want 12 stable hex digits that differ", a, b)
	}
}

func TestRequestID(t *testing.T) {
	for in, keep := range map[string]bool{"abc-123_x.y": true, "": false, "has space": false, "<script>": false, strings.Repeat("a", 65): false} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Request-Id", in)
		got := RequestID(r)
		if (got == in) != keep || got == "" {
			t.Errorf("RequestID(%q) = %q; keep %v", in, got, keep)
		}
	}
}

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	l, err := NewLogger(&buf, "auto", "warn")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown", "k", 1)
	if s := buf.String(); strings.Contains(s, "hidden") || !strings.HasPrefix(s, `{"time":`) {
		t.Errorf("log = %q; want one JSON line at warn (not a terminal)", s)
	}
	if _, err := NewLogger(&buf, "xml", "info"); err == nil {
		t.Error("format xml: want an error")
	}
	if _, err := NewLogger(&buf, "json", "loud"); err == nil {
		t.Error("level loud: want an error")
	}
}
