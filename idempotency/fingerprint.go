package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
)

// ErrBody is returned by Fingerprint for a body that is not one JSON value,
// has an object with the same member twice, nests deeper than 64 levels or
// holds invalid UTF-8.
var ErrBody = errors.New("idempotency: body is not valid JSON")

// Fingerprint returns the hex SHA-256 of the canonical form of a JSON
// body: members sorted, whitespace dropped, strings re-escaped the same way,
// numbers as written. So member order and spacing do not change it. An
// empty body has the fingerprint of "". Bodies whose values mean the same
// in the application but are written differently ("7" and "7.00") need the
// application to canonicalise them first (see Config.Fingerprint).
func Fingerprint(body []byte) (string, error) {
	buf := canonBufs.Get().(*[]byte)
	defer canonBufs.Put(buf)
	out := (*buf)[:0]
	if rest := skipSpace(body); len(rest) > 0 {
		var err error
		if out, rest, err = canon(out, rest, 0); err != nil {
			return "", err
		}
		if len(skipSpace(rest)) > 0 {
			return "", fmt.Errorf("%w: data after the value", ErrBody)
		}
	}
	*buf = out
	sum := sha256.Sum256(out)
	return hex.EncodeToString(sum[:]), nil
}

// maxDepth bounds nesting, so a hostile body cannot exhaust the stack.
const maxDepth = 64

var canonBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}
