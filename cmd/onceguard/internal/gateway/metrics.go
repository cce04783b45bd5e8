package gateway

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the gateway's metrics, on their own registry. Labels are
// route patterns (as --route names them, "other" for proxied requests,
// "gateway" for the gateway's own paths), outcomes and status codes:
// never a user, a key or a path with its parameters.
type Metrics struct {
	Registry    *prometheus.Registry
	Requests    *prometheus.CounterVec   // route, outcome, code
	Duration    *prometheus.HistogramVec // route
	Upstream    *prometheus.HistogramVec // route, result: answered, outcome_unknown, unavailable, recovered_unknown
	Idempotency *prometheus.CounterVec   // outcome: the core's events (idempotency.Options.OnEvent)
	Tokens      prometheus.Counter       // submit tokens issued
}

// NewMetrics returns the gateway's metrics, registered.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onceguard_gateway_requests_total",
			Help: "Requests by route, outcome (forwarded, replayed, in_progress, mismatch, duplicate_submission, upstream_outcome_unknown, upstream_unavailable, answered, ...) and status."},
			[]string{"route", "outcome", "code"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "onceguard_gateway_request_duration_seconds",
			Help: "Time to answer a request, by route.", Buckets: prometheus.DefBuckets}, []string{"route"}),
		Upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "onceguard_gateway_upstream_duration_seconds",
			Help: "Guarded requests' upstream exchanges by route and result (answered, outcome_unknown, unavailable, recovered_unknown).", Buckets: prometheus.DefBuckets},
			[]string{"route", "result"}),
		Idempotency: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onceguard_gateway_idempotency_outcomes_total",
			Help: "What the duplicate protection decided, by outcome."}, []string{"outcome"}),
		Tokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "onceguard_gateway_submit_tokens_issued_total",
			Help: "Submit tokens issued."}),
	}
	m.Registry.MustRegister(m.Requests, m.Duration, m.Upstream, m.Idempotency, m.Tokens,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}
