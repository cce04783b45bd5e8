package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"

	"github.com/onceguard/onceguard/idempotency"
)

// MaxBody is the largest request body accepted (413 body_too_large above).
const MaxBody = 64 << 10

// ReadBody reads r's body up to MaxBody.
func ReadBody(r *http.Request) ([]byte, *idempotency.Problem) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		return nil, &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Unreadable body", Detail: "the request body could not be read"}
	}
	if len(body) > MaxBody {
		return nil, &idempotency.Problem{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large", Title: "Request body too large", Detail: fmt.Sprintf("the body is over %d bytes", MaxBody)}
	}
	return body, nil
}

// Decode parses body strictly into dst (a pointer to a struct): not JSON,
// trailing data or a member given twice is 400 invalid_json; an unknown
// member or a value of the wrong type is 400 invalid_request. Fields that
// must be present are checked by the caller (Missing helps).
func Decode(body []byte, dst any) *idempotency.Problem {
	// The fingerprint canonicaliser is the strict syntax check: it refuses
	// what encoding/json would silently accept (repeated members).
	if _, err := idempotency.Fingerprint(body); err != nil || len(bytes.TrimSpace(body)) == 0 {
		detail := "the body must be one JSON object"
		if err != nil {
			detail = strings.TrimPrefix(err.Error(), "idempotency: ")
		}
		return &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_json", Title: "Invalid JSON", Detail: detail}
	}
	// encoding/json matches member names ignoring case (and with Unicode
	// folding): {"amount":"1","AMOUNT":"999"} would decode as 999. Members
	// must be named exactly; NUL is refused in every string (no database
	// stores it the same way).
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil || members == nil {
		// Valid JSON (checked above), but not an object.
		return &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Invalid request", Detail: "the body must be a JSON object"}
	}
	names := fieldNames(dst)
	unknown, found := "", false
	for name := range members { // the first unknown in sorted order: the same answer every time
		if !names[name] && (!found || name < unknown) {
			unknown, found = name, true
		}
	}
	if found {
		return &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Invalid request", Detail: fmt.Sprintf("unknown member %q", unknown)}
	}
	if nulEscape(body) {
		return &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Invalid request", Detail: "strings must not contain NUL"}
	}
	if d, ok := dst.(membersDecoder); ok {
		d.takeMembers(members)
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		var typeErr *json.UnmarshalTypeError
		detail := err.Error()
		switch {
		case errors.As(err, &typeErr) && typeErr.Field != "":
			detail = fmt.Sprintf("%s: wrong type (%s)", typeErr.Field, typeErr.Value)
		case strings.HasPrefix(detail, "json: unknown field "):
			detail = "unknown member " + strings.TrimPrefix(detail, "json: unknown field ")
		}
		return &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Invalid request", Detail: detail}
	}
	return nil
}

// membersDecoder is a body whose every field is a json.RawMessage: it takes its members from
// the parse Decode has made already, where a decoder would parse the body once more to the
// same bytes (a money request's body, decoded on every deposit and withdrawal).
type membersDecoder interface {
	takeMembers(map[string]json.RawMessage)
}

// Missing is the 400 invalid_request for a required member that is absent.
func Missing(member string) *idempotency.Problem {
	return &idempotency.Problem{Status: http.StatusBadRequest, Code: "invalid_request", Title: "Invalid request", Detail: member + ": required"}
}

var fieldNameCache sync.Map // reflect.Type -> map[string]bool

// fieldNames returns the JSON member names of the struct dst points to.
func fieldNames(dst any) map[string]bool {
	t := reflect.TypeOf(dst)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v, ok := fieldNameCache.Load(t); ok {
		return v.(map[string]bool)
	}
	names := map[string]bool{}
	if t.Kind() == reflect.Struct {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			names[name] = true
		}
	}
	fieldNameCache.Store(t, names)
	return names
}

// nulEscape reports whether body (valid JSON) has a string holding NUL: an escape \u0000, whose
// backslash is not itself escaped (the text \\u0000 is a backslash and "u0000").
func nulEscape(body []byte) bool {
	for i := 0; ; {
		j := bytes.Index(body[i:], []byte(`\u0000`))
		if j < 0 {
			return false
		}
		at := i + j
		n := 0 // backslashes before this one
		for k := at - 1; k >= 0 && body[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return true
		}
		i = at + 1
	}
}
