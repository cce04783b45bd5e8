package obs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/memlock"
)

func TestHash(t *testing.T) {
	if Hash("") != "" {
		t.Errorf(`Hash("") = %q; want ""`, Hash(""))
	}
	a, b := Hash("st_secret"), Hash("st_secret2")
	if len(a) != 12 || a == b || strings.Contains(a, "secret") || Hash("st_secret") != a {
		t.Errorf("Hash = %q, %q; want 12 stable hex digits that differ", a, b)
	}
}

func TestRequestID(t *testing.T) {
	for in, keep := range map[string]bool{"abc-123_x.y": true, "": false, "has space": false, "<script>": false, strings.Repeat("a", 65): false} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Request-Id", in)
		got := RequestID(r)
		if (got == in) != keep || got == "" {
			t.Errorf("RequestID(%q) = %q; keep %v", in, got, keep)
		}
	}
}

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	l, err := NewLogger(&buf, "auto", "warn")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown", "k", 1)
	if s := buf.String(); strings.Contains(s, "hidden") || !strings.HasPrefix(s, `{"time":`) {
		t.Errorf("log = %q; want one JSON line at warn (not a terminal)", s)
	}
	if _, err := NewLogger(&buf, "xml", "info"); err == nil {
		t.Error("format xml: want an error")
	}
	if _, err := NewLogger(&buf, "json", "loud"); err == nil {
		t.Error("level loud: want an error")
	}
}

func TestLockResult(t *testing.T) {
	for err, want := range map[error]string{
		nil:                 "acquired",
		lock.ErrNotAcquired: "busy",
		fmt.Errorf("dial: %w", lock.ErrUnavailable): "unavailable",
		errors.New("boom"):                          "error",
	} {
		if got := LockResult(err); got != want {
			t.Errorf("LockResult(%v) = %q; want %q", err, got, want)
		}
	}
}

// A timed lock backend times each database round trip and keeps the
// backend's wake-ups (lock.Waiter) when it has them.
func TestTimeLockBackend(t *testing.T) {
	m := NewMetrics()
	b := m.TimeLockBackend(&memlock.Backend{})
	if _, ok := b.(lock.Waiter); !ok {
		t.Fatal("the timed memlock backend is no lock.Waiter")
	}
	l := lock.New(b, nil)
	lease, err := l.TryAcquire(context.Background(), "k", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"lock_acquire", "lock_release"} {
		var d dto.Metric
		if err := m.DB.WithLabelValues(op).(prometheus.Metric).Write(&d); err != nil || d.GetHistogram().GetSampleCount() != 1 {
			t.Errorf("db_duration_seconds{op=%q} = %v samples (%v); want 1", op, d.GetHistogram().GetSampleCount(), err)
		}
	}
}

// Exemplify gives every labelled metric its children: Gather then lists
// every onceguard metric, with every closed label value.
func TestExemplify(t *testing.T) {
	m := NewMetrics()
	m.Exemplify()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]map[string]map[string]bool{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "onceguard_") {
			continue
		}
		seen[f.GetName()] = map[string]map[string]bool{}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if seen[f.GetName()][l.GetName()] == nil {
					seen[f.GetName()][l.GetName()] = map[string]bool{}
				}
				seen[f.GetName()][l.GetName()][l.GetValue()] = true
			}
		}
	}
	if len(seen) != 22 {
		t.Errorf("Gather lists %d onceguard metrics; want 22", len(seen))
	}
	for name, labels := range LabelValues() {
		for l, values := range labels {
			for _, v := range values {
				if !seen[name][l][v] {
					t.Errorf("%s{%s=%q} not gathered", name, l, v)
				}
			}
		}
	}
	if !seen["onceguard_http_requests_total"]["route"]["example"] {
		t.Errorf("open label route: no example child")
	}
}

// The commit group histogram's last bound is the write gate's largest
// group, so that a full group is its own bucket, not +Inf's.
func TestGroupBuckets(t *testing.T) {
	for _, tc := range []struct {
		largest int
		want    []float64
	}{
		{16, []float64{1, 2, 4, 8, 16}},
		{12, []float64{1, 2, 4, 8, 12}},
		{1, []float64{1}},
		{0, []float64{1}},
	} {
		if got := groupBuckets(tc.largest); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("groupBuckets(%d) = %v; want %v", tc.largest, got, tc.want)
		}
	}
}
