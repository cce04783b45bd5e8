package money_test

// Fuzz targets for the amount parser (docs/api.md, "Money"). FuzzParse
// (money_test.go) checks that what parses formats back; these check the
// grammar itself against an independent reference (a regexp and math/big),
// the JSON forms, and the formatter over the whole int64 range.
//
//	go test -run XXX -fuzz FuzzParseGrammar -fuzztime 45s -parallel 1 ./internal/money/

import (
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"regexp"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// amountRE is the contract's grammar, verbatim.
var amountRE = regexp.MustCompile(`^(0|[1-9][0-9]*)(\.[0-9]{1,2})?$`)

// refCents is the reference value of s (which matches amountRE) in cents,
// computed with math/big: no int64 in the way.
func refCents(s string) *big.Int {
	intPart, frac, _ := strings.Cut(s, ".")
	for len(frac) < 2 {
		frac += "0"
	}
	v, ok := new(big.Int).SetString(intPart+frac, 10)
	if !ok {
		panic("refCents: " + s)
	}
	return v
}

// The largest amount Parse must accept: units*100+99 fits in int64 for
// every units up to (MaxInt64-99)/100.
var maxAccepted = big.NewInt((math.MaxInt64-99)/100*100 + 99)

var amountSeeds = []string{
	"0", "0.0", "0.00", "0.01", "7", "7.5", "7.50", "10.00", "1000000.00", "1000000.01",
	// refused by the grammar
	"", ".", ".5", "5.", "00.10", "007", "-0", "-1", "+1", "1e3", "1E3", "1e-2", "0x10", "1_000",
	" 1", "1 ", "1,50", "1.505", "1..5", "1.5.5", "NaN", "Inf", "-Inf", "٣", "１", "\x00", "1\x00", "0.1\n",
	// around int64
	"92233720368547757.99", "92233720368547758.00", "92233720368547758.07", "92233720368547758.08",
	"9223372036854775807", "9223372036854775808", "18446744073709551616", "99999999999999999999",
	strings.Repeat("9", 400), "1" + strings.Repeat("0", 30) + ".00",
}

// FuzzParseGrammar: Parse accepts exactly the contract's grammar (up to
// the int64 limit) and returns the exact value, never through a float.
func FuzzParseGrammar(f *testing.F) {
	for _, s := range amountSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := money.Parse(s)
		matches := amountRE.MatchString(s)
		if err != nil {
			if !errors.Is(err, money.ErrInvalid) {
				t.Fatalf("Parse(%q) error %v does not match ErrInvalid", s, err)
			}
			if matches && refCents(s).Cmp(maxAccepted) <= 0 {
				t.Fatalf("Parse(%q) = %v; want %s cents (it matches the grammar and fits)", s, err, refCents(s))
			}
			return
		}
		if !matches {
			t.Fatalf("Parse(%q) = %d, nil; want ErrInvalid (not the contract's grammar)", s, a)
		}
		if want := refCents(s); want.Cmp(big.NewInt(int64(a))) != 0 {
			t.Fatalf("Parse(%q) = %d cents; want %s", s, a, want)
		}
		if a < 0 {
			t.Fatalf("Parse(%q) = %d: negative", s, a)
		}
	})
}

// FuzzFromJSON: a JSON amount is either a JSON string whose value matches
// the grammar or a JSON number whose text does; both forms give the same
// value, json.Unmarshal into an Amount agrees, and the string form of
// what is accepted (MarshalJSON) reads back to the same value.
func FuzzFromJSON(f *testing.F) {
	for _, s := range amountSeeds {
		f.Add([]byte(s))
		b, _ := json.Marshal(s)
		f.Add(b)
	}
	for _, s := range []string{`"\u0037"`, `"7\u002e50"`, `"7"x`, `"7`, `7"`, `""`, `"`, `null`, `true`, `[7]`, `{"a":7}`,
		`7.0e0`, `-0`, `"-0"`, `"\"7\""`, `"7" `, ` 7`, `"\ud800"`, "\"7\xff\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		a, err := money.FromJSON(raw)
		if err != nil {
			if !errors.Is(err, money.ErrInvalid) {
				t.Fatalf("FromJSON(%q) error %v does not match ErrInvalid", raw, err)
			}
			return
		}
		// The text the value was read from: a JSON string's contents, or
		// the raw text itself.
		text := string(raw)
		if len(raw) >= 2 && raw[0] == '"' {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatalf("FromJSON(%q) = %d, nil; but it is not a JSON string: %v", raw, a, err)
			}
			text = s
		} else if !json.Valid(raw) {
			t.Fatalf("FromJSON(%q) = %d, nil; want ErrInvalid (not JSON)", raw, a)
		}
		if !amountRE.MatchString(text) || refCents(text).Cmp(big.NewInt(int64(a))) != 0 {
			t.Fatalf("FromJSON(%q) = %d; its text %q is not an amount of that value", raw, a, text)
		}
		var viaJSON money.Amount
		if err := json.Unmarshal(raw, &viaJSON); err != nil || viaJSON != a {
			t.Fatalf("json.Unmarshal(%q) = %d, %v; FromJSON gave %d", raw, viaJSON, err, a)
		}
		// Both forms of the canonical text name the same value.
		for _, form := range []string{a.String(), `"` + a.String() + `"`} {
			if b, err := money.FromJSON(json.RawMessage(form)); err != nil || b != a {
				t.Fatalf("FromJSON(%s) = %d, %v; want %d (from %q)", form, b, err, a, raw)
			}
		}
		m, err := json.Marshal(a)
		if err != nil || string(m) != `"`+a.String()+`"` {
			t.Fatalf("json.Marshal(%d) = %s, %v", a, m, err)
		}
	})
}

var formatRE = regexp.MustCompile(`^-?(0|[1-9][0-9]*)\.[0-9]{2}$`)

// FuzzStringRoundTrip: every int64 formats with exactly two fraction
// digits and the exact value (checked with math/big), and every value
// Parse can hold reads back from its String.
func FuzzStringRoundTrip(f *testing.F) {
	for _, n := range []int64{0, 1, -1, 5, -5, 99, 100, -100, 750, -1000, 100000000,
		math.MaxInt64, math.MinInt64, math.MaxInt64 - 1, math.MinInt64 + 1, (math.MaxInt64 - 99) / 100 * 100, (math.MaxInt64-99)/100*100 + 99} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n int64) {
		s := money.Amount(n).String()
		if !formatRE.MatchString(s) {
			t.Fatalf("Amount(%d).String() = %q; want [-]digits.dd", n, s)
		}
		if n >= 0 && s[0] == '-' || n < 0 && s[0] != '-' {
			t.Fatalf("Amount(%d).String() = %q: wrong sign", n, s)
		}
		ref := refCents(strings.TrimPrefix(s, "-"))
		if n < 0 {
			ref.Neg(ref)
		}
		if ref.Cmp(big.NewInt(n)) != 0 {
			t.Fatalf("Amount(%d).String() = %q, which is %s cents", n, s, ref)
		}
		if n < 0 {
			if _, err := money.Parse(s); err == nil {
				t.Fatalf("Parse(%q) accepted a negative amount", s)
			}
			return
		}
		a, err := money.Parse(s)
		if big.NewInt(n).Cmp(maxAccepted) > 0 {
			if err == nil {
				t.Fatalf("Parse(%q) = %d; want ErrInvalid above the limit", s, a)
			}
			return
		}
		if err != nil || int64(a) != n {
			t.Fatalf("Parse(Amount(%d).String() = %q) = %d, %v", n, s, a, err)
		}
		var back money.Amount
		if b, _ := json.Marshal(money.Amount(n)); json.Unmarshal(b, &back) != nil || int64(back) != n {
			t.Fatalf("JSON round trip of %d via %s = %d", n, b, back)
		}
	})
}
