package stats

import (
	"math"
	"testing"
)

func TestPairedRatio(t *testing.T) {
	// Every pair 2: a mean of exactly 2 and no spread. Pairs that measured
	// nothing (0, NaN, +Inf) do not count.
	geo, lo, hi, n := PairedRatio([]float64{2, 2, 0, 2, math.NaN(), 2, math.Inf(1)})
	if n != 4 {
		t.Fatalf("n = %d, want 4", n)
	}
	for _, x := range []float64{geo, lo, hi} {
		if math.Abs(x-2) > 1e-9 {
			t.Fatalf("ratio %.6f, CI %.6f–%.6f; want exactly 2", geo, lo, hi)
		}
	}

	// 2 and 1/2 alternating: a geometric mean of 1 inside an interval
	// symmetric in the logs, whose half-width is t(3) × sd / √n: the logs
	// are ±ln 2, sd = ln 2 × √(4/3).
	geo, lo, hi, n = PairedRatio([]float64{2, 0.5, 2, 0.5})
	half := 3.182 * math.Ln2 * math.Sqrt(4.0/3) / 2
	if n != 4 || math.Abs(geo-1) > 1e-9 || math.Abs(math.Log(hi)-half) > 1e-9 || math.Abs(lo*hi-1) > 1e-9 {
		t.Fatalf("ratio %.6f, CI %.6f–%.6f over %d; want 1, half-width e^%.6f", geo, lo, hi, n, half)
	}

	if _, _, _, n := PairedRatio([]float64{1.5}); n != 1 {
		t.Fatalf("one pair: n = %d, want 1 (and no interval)", n)
	}
}

// T975 follows the table to 30 degrees of freedom and the known values
// beyond it, decreasing towards 1.96.
func TestT975(t *testing.T) {
	for _, c := range []struct {
		df   int
		want float64
	}{{1, 12.706}, {9, 2.262}, {30, 2.042}, {40, 2.021}, {60, 2.000}, {120, 1.980}, {1000, 1.962}} {
		if got := T975(c.df); math.Abs(got-c.want) > 0.001 {
			t.Errorf("T975(%d) = %.4f, want %.3f", c.df, got, c.want)
		}
	}
	for df := 2; df < 500; df++ {
		if !(T975(df) < T975(df-1)) {
			t.Fatalf("T975(%d) = %.4f is not below T975(%d) = %.4f", df, T975(df), df-1, T975(df-1))
		}
	}
}

func TestVerdict(t *testing.T) {
	for _, c := range []struct {
		lo, hi, want float64
		atMost       bool
		verdict      string
	}{
		{0.920, 1.019, 1, false, "TIE"},
		{1.01, 1.10, 1, false, "PASS"},
		{1.00, 1.10, 1, false, "PASS"},
		{0.90, 0.99, 1, false, "FAIL"},
		{1.5, 2.5, 2, false, "TIE"},
		{1.7, 2.4, 2.5, true, "PASS"},
		{1.7, 2.5, 2.5, true, "PASS"},
		{2.4, 2.6, 2.5, true, "TIE"},
		{2.6, 2.9, 2.5, true, "FAIL"},
	} {
		if got := Verdict(c.lo, c.hi, c.want, c.atMost); got != c.verdict {
			t.Errorf("Verdict(%g, %g, want %g, atMost %v) = %s, want %s", c.lo, c.hi, c.want, c.atMost, got, c.verdict)
		}
	}
}
