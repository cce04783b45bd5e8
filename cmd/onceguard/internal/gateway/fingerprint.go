package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/onceguard/onceguard/idempotency"
)

// Fingerprint returns the fingerprint of a guarded request's body, by its
// Content-Type, with the key field (keyField, "" for none) left out, so
// that one form sent under two submit tokens has one fingerprint and the
// repeat window sees it:
//
//   - JSON (application/json or any +json type): the canonical JSON of
//     idempotency.Fingerprint (member order and whitespace do not matter),
//     with the top-level member keyField removed from an object;
//   - application/x-www-form-urlencoded: the fields sorted by name, each
//     field's values in the order sent, keyField removed;
//   - an empty body: idempotency.Fingerprint's of "";
//   - any other type: the body's bytes, unless keyField is set and the
//     body is a JSON object holding it (the key was read from it): then
//     as JSON, keyField removed.
//
// A JSON body that is not valid is 400 invalid_json, a form that does not
// parse 400 invalid_request (both *idempotency.Problem).
func Fingerprint(contentType string, body []byte, keyField string) (string, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return idempotency.Fingerprint(nil)
	}
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case mt == "application/x-www-form-urlencoded":
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return "", &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Invalid request",
				Detail: "the body is not a valid application/x-www-form-urlencoded form"}
		}
		if keyField != "" {
			delete(form, keyField)
		}
		return digest("form", []byte(form.Encode())), nil // Encode sorts by name, keeps each name's values in order
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		return jsonFingerprint(body, keyField)
	case keyField != "" && jsonHolds(body, keyField):
		// The middleware reads the key field from a JSON object of any
		// Content-Type (a fetch() without headers sends text/plain): the
		// key is left out of such a body too, or one intent under two
		// keys would have two fingerprints and pass the window.
		return jsonFingerprint(body, keyField)
	}
	return digest("bytes", body), nil
}

// jsonHolds reports whether body is a JSON object with a top-level member
// name: one the middleware takes the key from.
func jsonHolds(body []byte, name string) bool {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return false
	}
	_, ok := obj[name]
	return ok
}

func jsonFingerprint(body []byte, keyField string) (string, error) {
	fp, err := idempotency.Fingerprint(body) // the strict syntax check too
	if err != nil {
		return "", &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_json", Title: "Invalid JSON",
			Detail: strings.TrimPrefix(err.Error(), "idempotency: ")}
	}
	if keyField == "" {
		return fp, nil
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil || obj == nil {
		return fp, nil // valid JSON, not an object: no key field to leave out
	}
	if _, ok := obj[keyField]; !ok {
		return fp, nil
	}
	delete(obj, keyField)
	rest, err := json.Marshal(obj) // no member twice (checked above), so nothing is lost
	if err != nil {
		return "", err
	}
	return idempotency.Fingerprint(rest)
}

// digest is the hex SHA-256 of kind, NUL, b: a form's and a byte body's
// fingerprints never equal a JSON body's.
func digest(kind string, b []byte) string {
	h := sha256.New()
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write(b)
	return kind + ":" + hex.EncodeToString(h.Sum(nil))
}
