package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// ErrBody is returned by Fingerprint for a body that is not one JSON value
// or has an object with the same member twice.
var ErrBody = errors.New("idempotency: body is not valid JSON")

// Fingerprint returns the hex SHA-256 of the canonical form of a JSON
// body: members sorted, whitespace dropped, strings re-escaped the same way,
// numbers as written. So member order and spacing do not change it. An
// empty body has the fingerprint of "". Bodies whose values mean the same
// in the application but are written differently ("7" and "7.00") need the
// application to canonicalise them first (see Config.Fingerprint).
func Fingerprint(body []byte) (string, error) {
	var canon bytes.Buffer
	if len(bytes.TrimSpace(body)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if err := canonical(dec, &canon, 0); err != nil {
			return "", err
		}
		if _, err := dec.Token(); err != io.EOF {
			return "", fmt.Errorf("%w: data after the value", ErrBody)
		}
	}
	sum := sha256.Sum256(canon.Bytes())
	return hex.EncodeToString(sum[:]), nil
}

// maxDepth bounds nesting, so a hostile body cannot exhaust the stack.
const maxDepth = 64

func canonical(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%w: nested deeper than %d", ErrBody, maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBody, err)
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '[':
			out.WriteByte('[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					out.WriteByte(',')
				}
				if err := canonical(dec, out, depth+1); err != nil {
					return err
				}
			}
			out.WriteByte(']')
		case '{':
			type member struct {
				name string
				val  []byte
			}
			var ms []member
			for dec.More() {
				nt, err := dec.Token()
				if err != nil {
					return fmt.Errorf("%w: %v", ErrBody, err)
				}
				name, _ := nt.(string)
				var val bytes.Buffer
				if err := canonical(dec, &val, depth+1); err != nil {
					return err
				}
				ms = append(ms, member{name, val.Bytes()})
			}
			slices.SortFunc(ms, func(a, b member) int { return bytes.Compare([]byte(a.name), []byte(b.name)) })
			out.WriteByte('{')
			for i, m := range ms {
				if i > 0 {
					if ms[i-1].name == m.name {
						return fmt.Errorf("%w: member %q twice", ErrBody, m.name)
					}
					out.WriteByte(',')
				}
				out.WriteString(strconv.Quote(m.name))
				out.WriteByte(':')
				out.Write(m.val)
			}
			out.WriteByte('}')
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return fmt.Errorf("%w: %v", ErrBody, err)
		}
	case string:
		out.WriteString(strconv.Quote(v))
	case json.Number:
		out.WriteString(v.String())
	case bool:
		out.WriteString(strconv.FormatBool(v))
	case nil:
		out.WriteString("null")
	}
	return nil
}
