package idemstore

import (
	"encoding/json"
	"net/http"
	"strings"
	"unicode/utf8"
)

// rawHeader marks an encoded header that holds bytes that are not UTF-8:
// JSON would turn them into U+FFFD, so its names and values are kept as
// bytes (base64 in JSON). A header that is all UTF-8 is plain JSON, as
// stores always wrote it.
const rawHeader = "~"

// MarshalHeader encodes h for a store that keeps it as text; "" for an
// empty header. UnmarshalHeader gives back h byte for byte.
func MarshalHeader(h http.Header) (string, error) {
	if len(h) == 0 {
		return "", nil
	}
	if headerUTF8(h) {
		b, err := json.Marshal(h)
		return string(b), err
	}
	raw := make([][][]byte, 0, len(h))
	for k, vs := range h {
		e := [][]byte{[]byte(k)}
		for _, v := range vs {
			e = append(e, []byte(v))
		}
		raw = append(raw, e)
	}
	b, err := json.Marshal(raw)
	return rawHeader + string(b), err
}

// UnmarshalHeader decodes what MarshalHeader encoded; "" is a nil header.
func UnmarshalHeader(s string) (http.Header, error) {
	if s == "" {
		return nil, nil
	}
	if rest, ok := strings.CutPrefix(s, rawHeader); ok {
		var raw [][][]byte
		if err := json.Unmarshal([]byte(rest), &raw); err != nil {
			return nil, err
		}
		h := make(http.Header, len(raw))
		for _, e := range raw {
			if len(e) == 0 {
				continue
			}
			vs := make([]string, 0, len(e)-1)
			for _, v := range e[1:] {
				vs = append(vs, string(v))
			}
			h[string(e[0])] = vs
		}
		return h, nil
	}
	var h http.Header
	err := json.Unmarshal([]byte(s), &h)
	return h, err
}

func headerUTF8(h http.Header) bool {
	for k, vs := range h {
		if !utf8.ValidString(k) {
			return false
		}
		for _, v := range vs {
			if !utf8.ValidString(v) {
				return false
			}
		}
	}
	return true
}
