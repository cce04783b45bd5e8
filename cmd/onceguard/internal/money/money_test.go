package money_test

import (
	"encoding/json"
	"errors"
	"math"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want money.Amount
		ok   bool
	}{
		{"0", 0, true}, {"7", 700, true}, {"7.5", 750, true}, {"7.50", 750, true}, {"0.01", 1, true},
		{"1000000.00", 100000000, true}, {"92233720368547757.99", 9223372036854775799, true},
		{"", 0, false}, {"07", 0, false}, {"7.", 0, false}, {".5", 0, false}, {"7.501", 0, false},
		{"-1", 0, false}, {"+1", 0, false}, {"1e2", 0, false}, {" 1", 0, false}, {"1 ", 0, false},
		{"1,5", 0, false}, {"NaN", 0, false}, {"92233720368547758.00", 0, false}, {"99999999999999999999", 0, false},
		{"٣", 0, false}, {"0x10", 0, false}, {"1.5a", 0, false},
	} {
		got, err := money.Parse(tc.in)
		if tc.ok && (err != nil || got != tc.want) {
			t.Errorf("Parse(%q) = %v, %v; want %v, nil", tc.in, got, err, tc.want)
		}
		if !tc.ok && !errors.Is(err, money.ErrInvalid) {
			t.Errorf("Parse(%q) = %v, %v; want ErrInvalid", tc.in, got, err)
		}
	}
}

func TestFromJSONAndFormat(t *testing.T) {
	for _, in := range []string{`"7"`, `7`, `"7.00"`, `7.00`, `"7.0"`} {
		a, err := money.FromJSON(json.RawMessage(in))
		if err != nil || a != 700 {
			t.Errorf("FromJSON(%s) = %v, %v; want 700", in, a, err)
		}
	}
	for _, in := range []string{`7e0`, `"7e0"`, `-7`, `null`, `true`, `"\u0037"x`, `[7]`} {
		if _, err := money.FromJSON(json.RawMessage(in)); err == nil {
			t.Errorf("FromJSON(%s) = nil error; want ErrInvalid", in)
		}
	}
	for a, want := range map[money.Amount]string{0: "0.00", 1: "0.01", 750: "7.50", -1000: "-10.00", -5: "-0.05",
		math.MinInt64: "-92233720368547758.08", math.MaxInt64: "92233720368547758.07"} {
		if got := a.String(); got != want {
			t.Errorf("Amount(%d).String() = %q; want %q", int64(a), got, want)
		}
	}
	if b, _ := json.Marshal(money.Amount(1234)); string(b) != `"12.34"` {
		t.Errorf("json.Marshal = %s; want \"12.34\"", b)
	}
	if _, err := money.Amount(math.MaxInt64).Add(1); err == nil {
		t.Error("Add overflow = nil error")
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"0", "7.5", "10.00", "007", "1e9", "-0", "9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := money.Parse(s)
		if err != nil {
			return
		}
		// What parses formats back to the same value.
		again, err := money.Parse(a.String())
		if err != nil || again != a || a < 0 {
			t.Fatalf("Parse(%q) = %d; its String %q parses to %d, %v", s, a, a.String(), again, err)
		}
	})
}

// TestStringAndJSON pins the format String, Append and MarshalJSON share (a digit or sign off
// would change stored answers, which are replayed byte for byte).
func TestStringAndJSON(t *testing.T) {
	for _, tc := range []struct {
		in   money.Amount
		want string
	}{
		{0, "0.00"}, {1, "0.01"}, {9, "0.09"}, {10, "0.10"}, {99, "0.99"}, {100, "1.00"}, {750, "7.50"},
		{-1, "-0.01"}, {-100, "-1.00"}, {-1005, "-10.05"},
		{math.MaxInt64, "92233720368547758.07"}, {math.MinInt64, "-92233720368547758.08"},
	} {
		if got := tc.in.String(); got != tc.want {
			t.Errorf("Amount(%d).String() = %q, want %q", int64(tc.in), got, tc.want)
		}
		if got := string(tc.in.Append([]byte("x"))); got != "x"+tc.want {
			t.Errorf("Amount(%d).Append = %q, want %q", int64(tc.in), got, "x"+tc.want)
		}
		if got, err := json.Marshal(tc.in); err != nil || string(got) != `"`+tc.want+`"` {
			t.Errorf("json.Marshal(Amount(%d)) = %s, %v; want %q", int64(tc.in), got, err, tc.want)
		}
	}
}
