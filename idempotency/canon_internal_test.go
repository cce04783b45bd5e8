package idempotency

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The canonical form, so every fingerprint, is exactly the reference's:
// records stored before must still match their retries. Same output for
// valid bodies, same error text for invalid ones.
func FuzzCanonMatchesReference(f *testing.F) {
	for _, s := range []string{``, ` `, `{}`, `[]`, `{"a":1,"b":[1,2,{"c":null}]}`, `{"b":2,"a":1}`, `{"a":1,"a":1}`, `"x"`, `1e400`,
		`[[[[[[[[[[[[`, `{"a":"\u00e9"}`, `{"a":1} {}`, `{"z":{"y":{"x":[{"b":1,"a":2}],"w":"\n\"\\"}},"a":[]}`,
		`{"a\u0000":1,"a":2}`, `{"\ud83d\ude00":true,"b":false}`, `{"a":"\ud800"}`, `{"a":"\q"}`, `{"a" : 1 , "b" : { "d":1, "c":2 } }`,
		`{"k0":0,"k9":9,"k8":8,"k7":7,"k6":6,"k5":5,"k4":4,"k3":3,"k2":2,"k1":1}`, `{"a":1,"a":{"b":2}}`, `{"a":{"b":1,"b":2}}`,
		`[1,{"b":[{"d":4,"c":3}],"a":0},-0.5e+3]`, `{"a":tru}`, `{"a":1,}`, `{"a"}`, `[1,]`, "\"\x01\"", `"` + "\xff" + `"`,
		// Edges (mutation audit 2): a broken surrogate pair, the last
		// control character, uppercase hex, a form feed (not JSON space),
		// and nesting just inside and just past the limit.
		`{"a":"\ud800\u0041"}`, `{"a":"\u001f"}`, `{"a":"\u00EF\u00eF"}`, "\f{}", "{}\f",
		strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth), strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1),
		strings.Repeat("[", maxDepth+2) + strings.Repeat("]", maxDepth+2)} {
		f.Add([]byte(s))
	}
	// The checked-in corpus of FuzzFingerprint too.
	files, _ := filepath.Glob("testdata/fuzz/FuzzFingerprint/*")
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if s, ok := strings.CutPrefix(line, "[]byte("); ok {
				if v, err := strconv.Unquote(strings.TrimSuffix(s, ")")); err == nil {
					f.Add([]byte(v))
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		want, werr := refFingerprint(body)
		got, gerr := Fingerprint(body)
		if got != want || (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
			t.Fatalf("Fingerprint(%q) = %q, %v; the reference %q, %v", body, got, gerr, want, werr)
		}
		if werr == nil {
			ref, _, _ := refCanon(nil, refSkipSpace(body), 0)
			out, _ := appendCanonical([]byte("prefix"), body)
			if len(refSkipSpace(body)) > 0 && !bytes.Equal(out, append([]byte("prefix"), ref...)) {
				t.Fatalf("canonical %q = %q; the reference %q", body, out, ref)
			}
		}
	})
}

// Fingerprint allocates only its result for bodies of small objects
// without escapes.
func TestFingerprintAllocs(t *testing.T) {
	body := []byte(`{"amount":"10.00","to":{"iban":"DE00","name":"A"},"tags":["x","y"]}`)
	if _, err := Fingerprint(body); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = Fingerprint(body) }); n > 1 {
		t.Errorf("Fingerprint allocates %v times; want 1 (its result)", n)
	}
}
