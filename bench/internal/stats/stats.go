// Package stats is the bench's arithmetic for paired measurements: the
// ratio of two contenders measured in alternating blocks, with a
// confidence interval, and a target's verdict from that interval. The
// Redis group (package main of the bench module) and the service load
// (bench/load) both judge their paired targets with it.
package stats

import "math"

// PairedRatio summarizes ratios, one per pair of blocks (the contender's
// figure over the reference's, measured back to back): the geometric mean,
// a 95% confidence interval for it (Student's t on the logs, so that a
// few pairs get the wider interval they warrant), and how many ratios
// counted. Ratios that are not positive numbers (a block that measured
// nothing) are left out; with fewer than two left there is no interval and
// n says so. Pairing blocks seconds or milliseconds apart takes the
// machine's drift out of each ratio; the interval assumes what is left is
// independent from pair to pair.
func PairedRatio(ratios []float64) (geo, lo, hi float64, n int) {
	var sum, sq float64
	for _, r := range ratios {
		if !(r > 0) || math.IsInf(r, 0) {
			continue
		}
		x := math.Log(r)
		sum += x
		sq += x * x
		n++
	}
	if n < 2 {
		return 0, 0, 0, n
	}
	mean := sum / float64(n)
	sd := math.Sqrt(max(0, sq-float64(n)*mean*mean) / float64(n-1))
	half := T975(n-1) * sd / math.Sqrt(float64(n))
	return math.Exp(mean), math.Exp(mean - half), math.Exp(mean + half), n
}

// t975 are Student's t distribution's 97.5th percentiles for 1 to 30
// degrees of freedom.
var t975 = [...]float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}

// T975 is the 97.5th percentile of Student's t with df degrees of freedom
// (df ≥ 1), the half-width factor of a two-sided 95% interval: from the
// table up to 30, then the first terms of its expansion around the normal
// 1.96 (within 0.001 of the exact value from 31 on).
func T975(df int) float64 {
	if df < 1 {
		return math.Inf(1)
	}
	if df <= len(t975) {
		return t975[df-1]
	}
	const z = 1.959964
	d := float64(df)
	return z + (z*z*z+z)/(4*d) + (5*math.Pow(z, 5)+16*z*z*z+3*z)/(96*d*d)
}

// Verdict judges a ratio whose 95% interval is lo–hi against a target:
// at least want, or at most want when atMost. PASS when the whole interval
// meets it, FAIL when none of it does, TIE when it spans the target, which
// the measurement cannot tell apart from a ratio on either side.
func Verdict(lo, hi, want float64, atMost bool) string {
	if atMost {
		lo, hi, want = -hi, -lo, -want
	}
	switch {
	case lo >= want:
		return "PASS"
	case hi < want:
		return "FAIL"
	default:
		return "TIE"
	}
}
