package idempotency

import "errors"

// Key errors, answered 400 by Middleware.
var (
	ErrKeyMissing = errors.New("idempotency: Idempotency-Key missing")
	ErrKeyInvalid = errors.New("idempotency: Idempotency-Key invalid")
)

// MaxKeyLen is the longest key, in characters, without the quotes of its
// quoted form.
const MaxKeyLen = 255

// ParseKey returns the key in the Idempotency-Key header values: one
// header, bare (abc) or the draft's quoted string ("abc"), of 1..MaxKeyLen
// characters from '!' to '~' without '"'. Both forms name the same key. No
// header or an empty one is ErrKeyMissing; anything else that does not
// match, or more than one header, is ErrKeyInvalid.
func ParseKey(values []string) (string, error) {
	switch {
	case len(values) == 0 || (len(values) == 1 && values[0] == ""):
		return "", ErrKeyMissing
	case len(values) > 1:
		return "", ErrKeyInvalid
	}
	k := values[0]
	if len(k) >= 2 && k[0] == '"' && k[len(k)-1] == '"' {
		k = k[1 : len(k)-1]
	}
	if k == "" || len(k) > MaxKeyLen {
		return "", ErrKeyInvalid
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < '!' || c > '~' || c == '"' {
			return "", ErrKeyInvalid
		}
	}
	return k, nil
}
