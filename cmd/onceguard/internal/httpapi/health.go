package httpapi

import (
	"context"
	"net/http"
	"time"
)

func healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyTimeout bounds each /readyz check.
const readyTimeout = 2 * time.Second

// readyz reports each component: 503 unavailable without the database,
// 200 degraded when another component is not ok (Redis unreachable and
// locks on the database, the provider unreachable and settlements left to
// the reconciler), else 200 ok. Without a Ping the database is reported
// ok.
func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	checks := s.cfg.Components
	if s.cfg.Ping == nil {
		checks = append([]Component{{Name: "database", Check: func(context.Context) (string, bool) { return "ok", true }}}, checks...)
	}
	WriteReadiness(w, r, s.cfg.Ping, checks)
}

// WriteReadiness answers a /readyz request with the components' states:
// ping, when set, is the "database" component. 503 unavailable when the
// database is not healthy, 200 degraded when another component is not,
// else 200 ok. The checks run at once, each with its own deadline, so
// that one that hangs costs the others nothing. The gateway's /readyz is
// this too.
func WriteReadiness(w http.ResponseWriter, r *http.Request, ping func(context.Context) error, components []Component) {
	type result struct {
		name, status string
		healthy      bool
	}
	checks := make([]Component, 0, len(components)+1)
	if ping != nil {
		checks = append(checks, Component{Name: "database", Check: func(ctx context.Context) (string, bool) {
			if err := ping(ctx); err != nil {
				return "unreachable", false
			}
			return "ok", true
		}})
	}
	checks = append(checks, components...)
	results := make(chan result, len(checks))
	for _, c := range checks {
		go func() {
			ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
			defer cancel()
			st, healthy := c.Check(ctx)
			results <- result{c.Name, st, healthy}
		}()
	}
	comps := map[string]string{}
	status, code := "ok", http.StatusOK
	degraded := false
	for range checks {
		res := <-results
		comps[res.name] = res.status
		switch {
		case res.name == "database" && !res.healthy:
			status, code = "unavailable", http.StatusServiceUnavailable
		case !res.healthy:
			degraded = true
		}
	}
	if degraded && status == "ok" {
		status = "degraded"
	}
	writeJSON(w, code, map[string]any{"status": status, "components": comps})
}
