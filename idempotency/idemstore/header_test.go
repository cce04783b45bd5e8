package idemstore_test

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	"github.com/onceguard/onceguard/idempotency/idemstore"
)

// MarshalHeader keeps a header byte for byte; one that is all UTF-8 is
// the plain JSON stores always wrote, so records stored before still read.
func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []http.Header{
		nil,
		{"Content-Type": {"application/json"}, "Location": {"/a", "/b"}},
		{"Content-Disposition": {"attachment; filename=\"caf\xe9.txt\""}, "X-A": {"ok"}},
		{"X-\xff": {""}},
	} {
		s, err := idemstore.MarshalHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		got, err := idemstore.UnmarshalHeader(s)
		if err != nil {
			t.Fatalf("UnmarshalHeader(%q): %v", s, err)
		}
		if len(h) == 0 {
			if s != "" || got != nil {
				t.Errorf("empty header: %q, %v; want \"\" and nil", s, got)
			}
			continue
		}
		if !reflect.DeepEqual(got, h) {
			t.Errorf("round trip of %q = %q", h, got)
		}
	}
	h := http.Header{"Content-Type": {"text/plain"}}
	s, _ := idemstore.MarshalHeader(h)
	legacy, _ := json.Marshal(h)
	if s != string(legacy) {
		t.Errorf("MarshalHeader(UTF-8) = %s; want the plain JSON %s", s, legacy)
	}
	if _, err := idemstore.UnmarshalHeader("~not json"); err == nil {
		t.Error("UnmarshalHeader of a corrupt raw header = nil error")
	}
}
