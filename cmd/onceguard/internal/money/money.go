// Package money holds exact amounts in minor units (cents): parsed from
// the text of a JSON string or number, never through a float, and
// formatted with exactly two fraction digits (docs/api.md, "Money").
package money

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Amount is a number of minor units (1/100 of the currency unit). It may
// be negative (ledger debits); parsed request amounts never are.
type Amount int64

// ErrInvalid is returned for text that is not an amount the API accepts.
var ErrInvalid = errors.New("money: invalid amount")

// maxUnits keeps units*100 + cents inside int64.
const maxUnits = (math.MaxInt64 - 99) / 100

// Parse reads text matching ^(0|[1-9][0-9]*)(\.[0-9]{1,2})?$ exactly:
// "7", "7.5" and "7.50" are 750 cents. Anything else (signs, exponents,
// spaces, a leading zero, three fraction digits, an empty string, an
// amount too large for int64) is ErrInvalid.
func Parse(s string) (Amount, error) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	intPart := s[:i]
	if intPart == "" || (len(intPart) > 1 && intPart[0] == '0') {
		return 0, fmt.Errorf("%w: %q", ErrInvalid, s)
	}
	units, err := strconv.ParseInt(intPart, 10, 64)
	if err != nil || units > maxUnits {
		return 0, fmt.Errorf("%w: %q is too large", ErrInvalid, s)
	}
	cents := int64(0)
	if rest := s[i:]; rest != "" {
		frac := rest[1:]
		if rest[0] != '.' || len(frac) < 1 || len(frac) > 2 {
			return 0, fmt.Errorf("%w: %q", ErrInvalid, s)
		}
		for _, c := range []byte(frac) {
			if c < '0' || c > '9' {
				return 0, fmt.Errorf("%w: %q", ErrInvalid, s)
			}
			cents = cents*10 + int64(c-'0')
		}
		if len(frac) == 1 {
			cents *= 10
		}
	}
	return Amount(units*100 + cents), nil
}

// FromJSON reads an amount from a raw JSON value: a string or a number
// whose text matches Parse's syntax ("7.50" or 7.50, never 7.5e0).
func FromJSON(raw json.RawMessage) (Amount, error) {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, fmt.Errorf("%w: %s", ErrInvalid, raw)
		}
		return Parse(s)
	}
	return Parse(string(raw))
}

// String formats a with exactly two fraction digits: "7.50", "-10.00".
func (a Amount) String() string {
	var b [24]byte
	return string(a.Append(b[:0]))
}

// Append appends a as String formats it to dst.
func (a Amount) Append(dst []byte) []byte {
	n := int64(a)
	u := uint64(n)
	if n < 0 {
		dst = append(dst, '-')
		u = uint64(-(n + 1)) + 1 // |MinInt64| without overflow
	}
	dst = strconv.AppendUint(dst, u/100, 10)
	c := u % 100
	return append(dst, '.', byte('0'+c/10), byte('0'+c%10))
}

// MarshalJSON writes a as a JSON string with two fraction digits.
func (a Amount) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 24)
	b = append(b, '"')
	return append(a.Append(b), '"'), nil
}

// Add returns a + b, or an error if it overflows.
func (a Amount) Add(b Amount) (Amount, error) {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		return 0, errors.New("money: overflow")
	}
	return s, nil
}

// UnmarshalJSON reads a JSON string or number with FromJSON's rules.
func (a *Amount) UnmarshalJSON(b []byte) error {
	v, err := FromJSON(b)
	if err != nil {
		return err
	}
	*a = v
	return nil
}
