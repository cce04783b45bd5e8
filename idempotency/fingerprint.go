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
	out, err := appendCanonical((*buf)[:0], body)
	var sum [sha256.Size]byte
	if err == nil {
		sum = sha256.Sum256(out)
	}
	if cap(out) <= 128<<10 { // do not keep a huge one
		*buf = out[:0]
		canonBufs.Put(buf)
	}
	if err != nil {
		return "", err
	}
	var hx [2 * sha256.Size]byte
	hex.Encode(hx[:], sum[:])
	return string(hx[:]), nil // the one allocation
}

// appendCanonical appends the canonical form of body to dst.
func appendCanonical(dst, body []byte) ([]byte, error) {
	rest := skipSpace(body)
	if len(rest) == 0 {
		return dst, nil
	}
	dst, rest, err := canon(dst, rest, 0)
	if err != nil {
		return dst, err
	}
	if len(skipSpace(rest)) > 0 {
		return dst, fmt.Errorf("%w: data after the value", ErrBody)
	}
	return dst, nil
}

// maxDepth bounds nesting, so a hostile body cannot exhaust the stack.
const maxDepth = 64

// canonBufs recycles the buffers the canonical forms are built in.
var canonBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}
