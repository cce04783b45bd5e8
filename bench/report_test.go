package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestPairedRatio(t *testing.T) {
	ms := func(xs ...float64) []time.Duration {
		var d []time.Duration
		for _, x := range xs {
			d = append(d, time.Duration(x*float64(time.Millisecond)))
		}
		return d
	}
	// a's blocks take half b's time in every pass it shares with b: a makes
	// twice b's cycles/s. Passes where either ran no block (0) do not count.
	a := []*result{{blocks: ms(5, 6, 0, 4)}, {blocks: ms(3, 7)}}
	b := []*result{{blocks: ms(10, 12, 9, 8)}, {blocks: ms(6, 0)}}
	geo, lo, hi, n := pairedRatio(a, b)
	if n != 4 {
		t.Fatalf("n = %d, want 4 pairs", n)
	}
	for _, x := range []float64{geo, lo, hi} {
		if math.Abs(x-2) > 1e-9 {
			t.Fatalf("ratio %.6f, CI %.6f–%.6f; want exactly 2", geo, lo, hi)
		}
	}

	// Ratios 2 and 1/2, alternating: a geometric mean of 1, an interval
	// around it.
	a = []*result{{blocks: ms(5, 20, 5, 20)}}
	b = []*result{{blocks: ms(10, 10, 10, 10)}}
	geo, lo, hi, n = pairedRatio(a, b)
	if n != 4 || math.Abs(geo-1) > 1e-9 || !(lo < 1 && hi > 1) || math.Abs(lo*hi-1) > 1e-9 {
		t.Fatalf("ratio %.6f, CI %.6f–%.6f over %d; want 1 inside a symmetric interval, 4 pairs", geo, lo, hi, n)
	}

	if _, _, _, n := pairedRatio(a[:0], b); n != 0 {
		t.Fatalf("no cells: n = %d", n)
	}
}

// A paired-1 target whose medians favour onceguard but whose paired blocks
// show no difference is printed TIE, not PASS.
func TestPairedTargetTie(t *testing.T) {
	ms := func(xs ...float64) []time.Duration {
		var d []time.Duration
		for _, x := range xs {
			d = append(d, time.Duration(x*float64(time.Millisecond)))
		}
		return d
	}
	cell := func(cycles int64, blocks ...float64) *result {
		return &result{window: time.Second, cycles: cycles, blocks: ms(blocks...)}
	}
	rep := &report{cells: map[string][]*result{
		"onceguard/paired-1":     {cell(1100, 5, 20, 5, 20), cell(1100, 5, 20)},
		"bsm/redislock/paired-1": {cell(1000, 10, 10, 10, 10), cell(1000, 10, 10)},
	}}
	var b strings.Builder
	printTargets(&b, rep)
	var line string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, "paired-1 cycles/s: onceguard / bsm/redislock") {
			line = l
		}
	}
	if !strings.Contains(line, "TIE") || strings.Contains(line, "PASS") {
		t.Fatalf("paired-1 target line %q: want TIE, not PASS", line)
	}
	if !strings.Contains(line, "1.10×") {
		t.Fatalf("paired-1 target line %q: want the medians' ratio 1.10× shown", line)
	}
}

// The 1 ms poller runs only the blocking scenario, and the targets show
// onceguard's handoffs against it next to the 100 ms retry.
func TestOneMsPoller(t *testing.T) {
	var cfg config
	var poller *library
	for _, l := range newRedisLibraries("127.0.0.1:1", nil) {
		defer l.close()
		if l.name == libBSM1ms {
			poller = l
		}
	}
	if poller == nil {
		t.Fatalf("no %s library", libBSM1ms)
	}
	for _, sc := range scenarios {
		if sc.group != groupRedis {
			continue
		}
		if got := cfg.runs(poller, sc); got != sc.blocking {
			t.Errorf("%s runs %s: %v, want %v", libBSM1ms, sc.name, got, sc.blocking)
		}
	}

	cell := func(handoffs int64) []*result { return []*result{{window: time.Second, handoffs: handoffs}} }
	rep := &report{cells: map[string][]*result{
		"onceguard/onekey-16-block":     cell(2300),
		"bsm/redislock/onekey-16-block": cell(100),
		libBSM1ms + "/onekey-16-block":  cell(1000),
	}}
	var b strings.Builder
	printTargets(&b, rep)
	var retry, poll bool
	for _, l := range strings.Split(b.String(), "\n") {
		retry = retry || strings.Contains(l, "bsm/redislock (its documented 100 ms retry)") && strings.Contains(l, "23.00×")
		poll = poll || strings.Contains(l, "1 ms poller") && strings.Contains(l, "2.30×")
	}
	if !retry || !poll {
		t.Fatalf("want the handoff ratio against the 100 ms retry (23.00×) and the 1 ms poller (2.30×):\n%s", b.String())
	}
}
