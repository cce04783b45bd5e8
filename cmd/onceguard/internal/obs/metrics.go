// Package obs is the service's observability: Prometheus metrics and
// structured logs. The library packages know nothing of it: they take
// hooks (lock.Options.Observe, idempotency.Config.OnEvent,
// fallback.Options.OnStateChange), which the service wires here.
//
// Every label has a small, fixed set of values: a route pattern, a status
// code, an outcome. Never a user id, a key or a token.
package obs

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// SQLiteMaxGroup is the SQLite write gate's largest group of transactions
// per COMMIT (sqldb.DefaultMaxGroup, which obs does not import: the HTTP
// layer's graph holds no database package; the service's tests check the
// two agree), the last bound of onceguard_sqlite_commit_group_size.
const SQLiteMaxGroup = 16

// Metrics are the service's metrics, registered on their own registry.
type Metrics struct {
	Registry *prometheus.Registry

	HTTPRequests     *prometheus.CounterVec   // route, method, code
	HTTPDuration     *prometheus.HistogramVec // route, method
	Idempotency      *prometheus.CounterVec   // outcome
	Tokens           *prometheus.CounterVec   // outcome: issued, consumed, released, invalid, foreign
	RepeatRejections *prometheus.CounterVec   // route
	LockAcquires     *prometheus.CounterVec   // backend, result: acquired, busy, unavailable, error
	LockWait         *prometheus.HistogramVec // backend
	LockHold         *prometheus.HistogramVec // backend
	LockLost         *prometheus.CounterVec   // backend
	FallbackDegraded prometheus.Gauge         // 1 while locks are on the database because Redis does not answer
	FallbackSwitches *prometheus.CounterVec   // to: database, redis
	DB               *prometheus.HistogramVec // op: the store's operations, the key store's (key_*, window_*, token_*) and the database locks' (lock_*)
	Provider         *prometheus.HistogramVec // op, result
	ReconcilerPend   prometheus.Gauge         // deposits and withdrawals pending, counted after each reconciler pass
	ReconcilerSettle *prometheus.CounterVec   // result: succeeded, failed, still_pending
	Money            *prometheus.CounterVec   // kind, outcome
	Notifications    *prometheus.CounterVec   // outcome: provider callbacks by answer
	EventsPublished  prometheus.Counter       // events the relay published (the stream's ack, a duplicate's too)
	EventsRetried    prometheus.Counter       // publishes that failed and were put back for a retry
	EventsBacklog    prometheus.Gauge         // events in the outbox not yet published
	SQLiteGroup      prometheus.Histogram     // SQLite: write transactions per COMMIT of the write gate
	SQLiteQueue      prometheus.Gauge         // SQLite: write transactions queued behind the last COMMIT

	vecs []vec // every labelled metric, for Exemplify
}

// vec is one labelled metric: its name, its labels and a way to make a
// child.
type vec struct {
	name   string
	labels []string
	touch  func(values ...string)
}

// labelValues are the closed sets of label values: metric -> label ->
// every value the service sets. Labels not named here (route, method,
// code, op) are open: the route patterns, status codes and database
// operations the service has.
var labelValues = map[string]map[string][]string{
	"onceguard_idempotency_outcomes_total": {"outcome": {"new", "recovered", "replayed", "in_progress", "mismatch",
		"key_missing", "key_invalid", "token_invalid", "token_foreign", "token_required", "duplicate_submission", "released", "store_unavailable", "interrupted", "unrecorded"}},
	"onceguard_submit_tokens_total":          {"outcome": {"issued", "offered", "consumed", "released", "invalid", "foreign"}},
	"onceguard_lock_acquires_total":          {"backend": lockBackends, "result": {"acquired", "busy", "unavailable", "error"}},
	"onceguard_lock_wait_seconds":            {"backend": lockBackends},
	"onceguard_lock_hold_seconds":            {"backend": lockBackends},
	"onceguard_lock_lost_total":              {"backend": lockBackends},
	"onceguard_lock_fallback_switches_total": {"to": {"database", "redis"}},
	"onceguard_provider_duration_seconds":    {"op": {"charge", "payout", "lookup"}, "result": {"ok", "unknown_outcome", "error"}},
	"onceguard_reconciler_settled_total":     {"result": {"succeeded", "failed", "still_pending"}},
	"onceguard_psp_notifications_total":      {"outcome": {"settled", "agreed", "conflict", "not_found", "invalid_signature", "signature_expired", "invalid_request"}},
	"onceguard_money_movements_total": {"kind": {"deposit", "withdrawal", "payment"},
		"outcome": {"succeeded", "failed", "pending", "busy", "insufficient_funds", "paid", "in_progress", "already_paid"}},
}

var lockBackends = []string{"redis", "database", "memory"}

// LabelValues returns the closed sets of label values, metric -> label ->
// values (a copy): what a dashboard may match a label against exactly.
func LabelValues() map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for name, labels := range labelValues {
		out[name] = map[string][]string{}
		for l, vs := range labels {
			out[name][l] = slices.Clone(vs)
		}
	}
	return out
}

// Exemplify gives every labelled metric its children, so that Gather
// lists every metric with its labels: one per combination of the closed
// label values (LabelValues), with "example" for an open label. For tests
// and documentation; never on a serving instance, whose series it would
// pollute.
func (m *Metrics) Exemplify() {
	for _, v := range m.vecs {
		v.touchAll("example")
	}
}

// touchAll makes v's child for every combination of its closed label
// values, with open for an open label ("" : none made for v).
func (v vec) touchAll(open string) {
	sets := make([][]string, len(v.labels))
	for i, l := range v.labels {
		sets[i] = labelValues[v.name][l]
		if len(sets[i]) == 0 {
			if open == "" {
				return
			}
			sets[i] = []string{open}
		}
	}
	var walk func(i int, values []string)
	walk = func(i int, values []string) {
		if i == len(sets) {
			v.touch(values...)
			return
		}
		for _, x := range sets[i] {
			walk(i+1, append(values, x))
		}
	}
	walk(0, nil)
}

// Latency buckets from 0.5 ms to 10 s: lock waits and database calls are
// sub-millisecond to seconds.
var buckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// NewMetrics creates and registers the metrics, with the Go runtime and
// process collectors. Metrics whose labels all have closed sets
// (LabelValues) start with every series at 0.
func NewMetrics() *Metrics {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var vecs []vec
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "onceguard", Name: name, Help: help}, labels)
		r.MustRegister(c)
		vecs = append(vecs, vec{"onceguard_" + name, labels, func(v ...string) { c.WithLabelValues(v...) }})
		return c
	}
	hist := func(name, help string, labels ...string) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "onceguard", Name: name, Help: help, Buckets: buckets}, labels)
		r.MustRegister(h)
		vecs = append(vecs, vec{"onceguard_" + name, labels, func(v ...string) { h.WithLabelValues(v...) }})
		return h
	}
	plain := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "onceguard", Name: name, Help: help})
		r.MustRegister(c)
		return c
	}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "onceguard", Name: name, Help: help})
		r.MustRegister(g)
		return g
	}
	m := &Metrics{
		Registry:         r,
		HTTPRequests:     counter("http_requests_total", "HTTP requests by route pattern, method and status code.", "route", "method", "code"),
		HTTPDuration:     hist("http_request_duration_seconds", "HTTP request latency by route pattern and method.", "route", "method"),
		Idempotency:      counter("idempotency_outcomes_total", "Keyed requests by what the Idempotency-Key check decided.", "outcome"),
		Tokens:           counter("submit_tokens_total", "Submit tokens issued (minted on request), offered (with a money answer, Next-Submit-Token), consumed (their request's answer kept), released (their request failed and freed them for a retry), and refused (invalid, foreign).", "outcome"),
		RepeatRejections: counter("repeat_window_rejections_total", "Requests refused 429 duplicate_submission by the repeat-submit window.", "route"),
		LockAcquires:     counter("lock_acquires_total", "Lock acquires by the backend that answered and the result.", "backend", "result"),
		LockWait:         hist("lock_wait_seconds", "Time to a lock acquire's answer.", "backend"),
		LockHold:         hist("lock_hold_seconds", "How long leases were held, to release or loss.", "backend"),
		LockLost:         counter("lock_lost_total", "Leases lost while held: expired, found gone by renewal, or found expired or another owner's at release (a release the backend did not answer is not counted).", "backend"),
		FallbackDegraded: gauge("lock_fallback_degraded", "1 while locks are on the database because Redis does not answer."),
		FallbackSwitches: counter("lock_fallback_switches_total", "Lock breaker switches, by where locks went.", "to"),
		DB:               hist("db_duration_seconds", "Database calls by operation.", "op"),
		Provider:         hist("provider_duration_seconds", "Payment provider calls by operation and result.", "op", "result"),
		ReconcilerPend:   gauge("reconciler_pending", "Deposits and withdrawals pending (the reconciler's backlog), counted after each of its passes."),
		ReconcilerSettle: counter("reconciler_settled_total", "Pending movements the reconciler looked at, by result.", "result"),
		Money:            counter("money_movements_total", "Money movement requests by kind and outcome.", "kind", "outcome"),
		EventsPublished:  plain("events_published_total", "Events (--events) the outbox relay published to JetStream: acknowledged by the stream, a duplicate's ack included."),
		EventsRetried:    plain("events_retried_total", "Event publishes that failed (NATS away, no ack in time) and were put back in the outbox for a retry with backoff."),
		EventsBacklog:    gauge("events_pending", "Events in the outbox not yet published: counted every 5 s by the relay and on each /readyz."),
		Notifications:    counter("psp_notifications_total", "Provider callbacks by answer: settled (this one moved the movement), agreed (already so, or seen before), conflict, not_found, invalid_signature, signature_expired, invalid_request.", "outcome"),
	}
	m.SQLiteGroup = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "onceguard", Name: "sqlite_commit_group_size",
		Help:    fmt.Sprintf("SQLite (the embedded default): write transactions committed together per COMMIT (the write gate's groups, at most %d).", SQLiteMaxGroup),
		Buckets: groupBuckets(SQLiteMaxGroup)})
	r.MustRegister(m.SQLiteGroup)
	m.SQLiteQueue = gauge("sqlite_write_queue", "SQLite (the embedded default): write transactions waiting for the write gate after its last COMMIT.")
	m.vecs = vecs
	// Every series of a metric whose labels are all closed exists at 0
	// from the start, so that an alert on one (store_unavailable, a lost
	// lock) has a series to evaluate before its first event.
	for _, v := range vecs {
		v.touchAll("")
	}
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}

// Since is seconds since start, for Observe.
func Since(start time.Time) float64 { return time.Since(start).Seconds() }

// groupBuckets are the bounds of the commit group histogram: powers of
// two up to the gate's largest group, which is the last bound.
func groupBuckets(largest int) []float64 {
	var b []float64
	for n := 1; n < largest; n *= 2 {
		b = append(b, float64(n))
	}
	return append(b, float64(max(largest, 1)))
}
