package main

import (
	"sort"
	"strings"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
)

// A fresh service's /metrics already has every series of a metric whose
// labels have closed sets, at 0, so that an alert on one (docs/metrics.md's
// store_unavailable, lock_lost_total) has a series before the first event.
func TestServeMetricsStartAtZero(t *testing.T) {
	text := scrape(t, startServe(t))
	for _, want := range []struct {
		name   string
		labels map[string]string
	}{
		{"onceguard_idempotency_outcomes_total", map[string]string{"outcome": "store_unavailable"}},
		{"onceguard_lock_lost_total", map[string]string{"backend": "memory"}},
		{"onceguard_lock_lost_total", map[string]string{"backend": "redis"}},
		{"onceguard_lock_lost_total", map[string]string{"backend": "database"}},
		{"onceguard_submit_tokens_total", map[string]string{"outcome": "foreign"}},
		{"onceguard_lock_acquires_total", map[string]string{"backend": "redis", "result": "error"}},
	} {
		if v, ok := metricValue(text, want.name, want.labels); !ok || v != 0 {
			t.Errorf("%s%v = %v, present %v; want 0, present", want.name, want.labels, v, ok)
		}
	}
	for name, labels := range obs.LabelValues() {
		if !strings.HasSuffix(name, "_total") {
			continue // histograms: their _count, checked through the counters' rule below
		}
		keys := make([]string, 0, len(labels))
		for l := range labels {
			keys = append(keys, l)
		}
		sort.Strings(keys)
		var walk func(i int, set map[string]string)
		walk = func(i int, set map[string]string) {
			if i == len(keys) {
				if v, ok := metricValue(text, name, set); !ok || v != 0 {
					t.Errorf("%s%v = %v, present %v; want 0, present", name, set, v, ok)
				}
				return
			}
			for _, x := range labels[keys[i]] {
				next := map[string]string{keys[i]: x}
				for k, v := range set {
					next[k] = v
				}
				walk(i+1, next)
			}
		}
		walk(0, map[string]string{})
	}
	for _, hist := range []struct {
		name   string
		labels map[string]string
	}{
		{"onceguard_provider_duration_seconds_count", map[string]string{"op": "payout", "result": "unknown_outcome"}},
		{"onceguard_lock_wait_seconds_count", map[string]string{"backend": "redis"}},
	} {
		if v, ok := metricValue(text, hist.name, hist.labels); !ok || v != 0 {
			t.Errorf("%s%v = %v, present %v; want 0, present", hist.name, hist.labels, v, ok)
		}
	}
}
