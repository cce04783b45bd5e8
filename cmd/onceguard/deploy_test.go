package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/obs"
)

// deployDir holds the deployment examples these tests check.
const deployDir = "../../deploy"

// metric is one series family the service exports and its labels.
type metric struct {
	histogram bool
	labels    []string
}

// exported is every metric `onceguard serve` exports at /metrics, with its
// labels, and values the closed sets of label values (an exact matcher,
// label="value", on one of these labels must name one of them): both read
// from the service's own registry (obs.NewMetrics, every metric given its
// children by Exemplify), so that the dashboard is checked against what
// the service registers, not a copy of it.
var exported, values = registered()

func registered() (map[string]metric, map[string]map[string][]string) {
	m := obs.NewMetrics()
	m.Exemplify()
	fams, err := m.Registry.Gather()
	if err != nil {
		panic(err)
	}
	exp := map[string]metric{}
	vals := map[string]map[string][]string{}
	for _, f := range fams {
		name := f.GetName()
		if !strings.HasPrefix(name, "onceguard_") || len(f.GetMetric()) == 0 {
			continue // the Go runtime and process collectors
		}
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		exp[name] = metric{histogram: f.GetType() == dto.MetricType_HISTOGRAM, labels: labels}
		for _, sample := range f.GetMetric() {
			for _, l := range sample.GetLabel() {
				if l.GetValue() == "example" {
					continue // an open label: route, method, code, op
				}
				if vals[name] == nil {
					vals[name] = map[string][]string{}
				}
				if !slices.Contains(vals[name][l.GetName()], l.GetValue()) {
					vals[name][l.GetName()] = append(vals[name][l.GetName()], l.GetValue())
				}
			}
		}
	}
	return exp, vals
}

// The lists read from the registry are the service's: its metrics, their
// labels and the closed sets of values, token_foreign and released
// among them.
func TestRegistered(t *testing.T) {
	for name, labels := range map[string][]string{
		"onceguard_http_requests_total":           {"route", "method", "code"},
		"onceguard_http_request_duration_seconds": {"route", "method"},
		"onceguard_idempotency_outcomes_total":    {"outcome"},
		"onceguard_submit_tokens_total":           {"outcome"},
		"onceguard_lock_fallback_degraded":        nil,
		"onceguard_reconciler_pending":            nil,
		"onceguard_db_duration_seconds":           {"op"},
	} {
		slices.Sort(labels) // as Gather gives them
		if m, ok := exported[name]; !ok || !slices.Equal(m.labels, labels) {
			t.Errorf("exported[%s] = %+v (found %v); want labels %v", name, m, ok, labels)
		}
	}
	if len(exported) < 16 || !exported["onceguard_lock_wait_seconds"].histogram || exported["onceguard_lock_lost_total"].histogram {
		t.Errorf("exported = %v; want the service's 16 or more metrics, histograms marked", exported)
	}
	for _, c := range []struct{ metric, label, value string }{
		{"onceguard_idempotency_outcomes_total", "outcome", "token_foreign"},
		{"onceguard_idempotency_outcomes_total", "outcome", "released"},
		{"onceguard_submit_tokens_total", "outcome", "foreign"},
		{"onceguard_submit_tokens_total", "outcome", "released"},
		{"onceguard_lock_acquires_total", "result", "busy"},
		{"onceguard_lock_fallback_switches_total", "to", "redis"},
	} {
		if !slices.Contains(values[c.metric][c.label], c.value) {
			t.Errorf("values[%s][%s] = %v; want %q among them", c.metric, c.label, values[c.metric][c.label], c.value)
		}
	}
	if _, open := values["onceguard_http_requests_total"]["route"]; open {
		t.Errorf("route has a closed set of values %v; want it open", values["onceguard_http_requests_total"]["route"])
	}
}

// targetLabels are added by Prometheus to every series it scrapes.
var targetLabels = []string{"instance", "job"}

func loadDashboard(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(deployDir, "grafana", "onceguard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("grafana/onceguard.json: %v", err)
	}
	return d
}

// exprs returns every "expr" in the dashboard with where it is.
func exprs(d map[string]any) (out [][2]string) {
	var walk func(v any, where string)
	walk = func(v any, where string) {
		switch v := v.(type) {
		case map[string]any:
			if title, ok := v["title"].(string); ok {
				where = title
			}
			if e, ok := v["expr"].(string); ok {
				out = append(out, [2]string{where, e})
			}
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(v[k], where)
			}
		case []any:
			for _, x := range v {
				walk(x, where)
			}
		}
	}
	walk(d["panels"], "")
	return out
}

// Every PromQL expression of the dashboard names only exported metrics,
// their labels and their label values; every exported metric has a panel.
func TestDashboardMetrics(t *testing.T) {
	d := loadDashboard(t)
	all := exprs(d)
	if len(all) < len(exported) {
		t.Fatalf("dashboard has %d queries; want at least one per exported metric (%d)", len(all), len(exported))
	}
	used := map[string]bool{}
	for _, e := range all {
		names, err := checkPromQL(e[1])
		if err != nil {
			t.Errorf("panel %q: %s: %v", e[0], e[1], err)
		}
		for _, n := range names {
			used[n] = true
		}
	}
	for name := range exported {
		if !used[name] {
			t.Errorf("no panel queries %s", name)
		}
	}
	// The variables' queries too.
	tmpl, _ := d["templating"].(map[string]any)
	list, _ := tmpl["list"].([]any)
	labelValues := regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)
	for _, v := range list {
		v, _ := v.(map[string]any)
		if v["type"] != "query" {
			continue
		}
		q, _ := v["query"].(string)
		if m, ok := v["query"].(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %v: query %q; want label_values(metric, label)", v["name"], q)
			continue
		}
		if err := checkLabels([]string{m[1]}, []string{m[2]}); err != nil {
			t.Errorf("variable %v: %v", v["name"], err)
		}
	}
}

// The checker itself: what it must refuse.
func TestCheckPromQL(t *testing.T) {
	for _, tc := range []struct {
		expr string
		ok   bool
	}{
		{`sum by (route) (rate(onceguard_http_requests_total{instance=~"$instance"}[$__rate_interval]))`, true},
		{`histogram_quantile(0.99, sum by (backend, le) (rate(onceguard_lock_wait_seconds_bucket[5m])))`, true},
		{`max(onceguard_reconciler_pending)`, true},
		{`sum(rate(onceguard_http_request_total[5m]))`, false}, // a typo
		{`sum(rate(up[5m]))`, false},                                                     // not ours
		{`sum by (user_id) (rate(onceguard_http_requests_total[5m]))`, false},            // no such label
		{`sum(rate(onceguard_idempotency_outcomes_total{outcome="replay"}[5m]))`, false}, // no such value
		{`sum(rate(onceguard_lock_acquires_total_bucket[5m]))`, false},                   // a counter has no buckets
		{`rate(onceguard_http_requests_total{code=~"5..", route="/api/v1/orders"}[1m])`, true},
		{`sum(rate(onceguard_http_requests_total[5m])) / sum(rate(onceguard_lock_lost_total[5m]))`, true},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			_, err := checkPromQL(tc.expr)
			if (err == nil) != tc.ok {
				t.Errorf("checkPromQL() = %v; want ok %v", err, tc.ok)
			}
		})
	}
}

// PromQL words that are not metric names.
var keywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true,
}

// PromQL aggregation operators, which may be followed by "by (...)".
var aggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true, "count": true,
	"count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true,
}

// checkPromQL returns the exported metrics expr names, or an error naming
// what is not exported: a metric, a label or a label value. It knows
// enough PromQL for dashboards: selectors with matchers, ranges,
// functions, aggregations with by/without, binary operators.
func checkPromQL(expr string) ([]string, error) {
	var metrics, grouping []string
	i := 0
	for i < len(expr) {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j := strings.IndexByte(expr[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			i += j + 2
		case c == '[': // a range or subquery: durations and Grafana variables
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unterminated range at %d", i)
			}
			i += j + 1
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isWord(expr[i]) || expr[i] == '.') {
				i++
			}
		case isWord(c) || c == ':':
			j := i
			for j < len(expr) && (isWord(expr[j]) || expr[j] == ':') {
				j++
			}
			word := expr[i:j]
			next := strings.TrimLeft(expr[j:], " \t\n")
			i = j
			switch {
			case keywords[word] && strings.HasPrefix(next, "("): // by (a, b)
				k := strings.IndexByte(expr[i:], ')')
				if k < 0 {
					return nil, fmt.Errorf("unterminated %s at %d", word, i)
				}
				for l := range strings.SplitSeq(strings.Trim(strings.TrimSpace(expr[i:i+k]), "("), ",") {
					if l = strings.TrimSpace(l); l != "" {
						grouping = append(grouping, l)
					}
				}
				i += k + 1
			case keywords[word], aggregations[word]: // sum by (a) (...)
			case strings.HasPrefix(next, "("): // a function
			default:
				name, err := metricName(word)
				if err != nil {
					return nil, err
				}
				metrics = append(metrics, word)
				if strings.HasPrefix(next, "{") {
					i = len(expr) - len(next)
					k := strings.IndexByte(expr[i:], '}')
					if k < 0 {
						return nil, fmt.Errorf("unterminated matchers of %s", word)
					}
					if err := checkMatchers(word, name, expr[i+1:i+k]); err != nil {
						return nil, err
					}
					i += k + 1
				}
			}
		default:
			i++
		}
	}
	if len(metrics) == 0 {
		return nil, fmt.Errorf("names no metric")
	}
	bases := make([]string, len(metrics))
	for k, m := range metrics {
		bases[k], _ = metricName(m)
	}
	return bases, checkLabels(metrics, grouping)
}

func isWord(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// metricName maps a series name to its exported metric: a histogram's
// _bucket, _sum and _count series belong to it.
func metricName(series string) (string, error) {
	if _, ok := exported[series]; ok {
		return series, nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, suffix); ok && exported[base].histogram {
			return base, nil
		}
	}
	return "", fmt.Errorf("%s is not a metric the service exports", series)
}

// labelsOf returns the labels a series may carry.
func labelsOf(series string) []string {
	name, _ := metricName(series)
	ls := append(slices.Clone(exported[name].labels), targetLabels...)
	if strings.HasSuffix(series, "_bucket") {
		ls = append(ls, "le")
	}
	return ls
}

// checkLabels checks every grouping label is a label of one of the series.
func checkLabels(series, labels []string) error {
	var known []string
	for _, s := range series {
		if _, err := metricName(s); err != nil {
			return err
		}
		known = append(known, labelsOf(s)...)
	}
	for _, l := range labels {
		if !slices.Contains(known, l) {
			return fmt.Errorf("label %q is on none of %v", l, series)
		}
	}
	return nil
}

var matcher = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"\s*$`)

// checkMatchers checks `label op "value", ...` of a selector of series.
func checkMatchers(series, name, list string) error {
	for m := range strings.SplitSeq(list, ",") {
		if strings.TrimSpace(m) == "" {
			continue
		}
		p := matcher.FindStringSubmatch(m)
		if p == nil {
			return fmt.Errorf("%s: cannot read matcher %q", series, m)
		}
		label, op, value := p[1], p[2], p[3]
		if !slices.Contains(labelsOf(series), label) {
			return fmt.Errorf("%s has no label %q", series, label)
		}
		if allowed, ok := values[name][label]; ok && (op == "=" || op == "!=") && !strings.Contains(value, "$") && !slices.Contains(allowed, value) {
			return fmt.Errorf("%s{%s=%q}: want one of %v", series, label, value, allowed)
		}
	}
	return nil
}

// The dashboard loads in Grafana: a schema of this age, a Prometheus data
// source variable every panel uses, unique ids, panels on the grid.
func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	if v, _ := d["schemaVersion"].(float64); v < 36 || v > 41 {
		t.Errorf("schemaVersion = %v; want about 39", d["schemaVersion"])
	}
	if d["uid"] == "" || d["title"] == "" {
		t.Errorf("uid %q, title %q; want both", d["uid"], d["title"])
	}
	tmpl, _ := d["templating"].(map[string]any)
	list, _ := tmpl["list"].([]any)
	var dsVar string
	for _, v := range list {
		if v, _ := v.(map[string]any); v["type"] == "datasource" && v["query"] == "prometheus" {
			dsVar, _ = v["name"].(string)
		}
	}
	if dsVar == "" {
		t.Fatalf("templating has no Prometheus data source variable")
	}
	panels, _ := d["panels"].([]any)
	ids := map[float64]bool{}
	var check func(ps []any)
	check = func(ps []any) {
		for _, p := range ps {
			p, _ := p.(map[string]any)
			title, _ := p["title"].(string)
			id, _ := p["id"].(float64)
			if ids[id] {
				t.Errorf("panel %q: id %v used twice", title, id)
			}
			ids[id] = true
			if g, _ := p["gridPos"].(map[string]any); g == nil || g["w"] == nil || g["h"] == nil {
				t.Errorf("panel %q has no gridPos", title)
			}
			if nested, ok := p["panels"].([]any); ok {
				check(nested)
			}
			if p["type"] == "row" {
				continue
			}
			ds, _ := p["datasource"].(map[string]any)
			if ds["uid"] != "${"+dsVar+"}" {
				t.Errorf("panel %q: datasource %v; want the variable ${%s}", title, p["datasource"], dsVar)
			}
			if targets, _ := p["targets"].([]any); len(targets) == 0 {
				t.Errorf("panel %q has no query", title)
			}
		}
	}
	check(panels)
}

// The examples set only variables the service reads, and the compose file
// runs three instances on PostgreSQL and Redis.
func TestExamples(t *testing.T) {
	var src strings.Builder
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			src.Write(b)
		}
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(deployDir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	envVar := regexp.MustCompile(`ONCEGUARD_[A-Z_]+`)
	for _, f := range []string{"docker-compose.yml", "Dockerfile", "systemd/onceguard.env.example", "systemd/onceguard@.service"} {
		for _, v := range envVar.FindAllString(read(f), -1) {
			if !strings.Contains(src.String(), `"`+v+`"`) {
				t.Errorf("%s sets %s, which onceguard does not read", f, v)
			}
		}
	}
	compose := read("docker-compose.yml")
	for _, want := range []string{
		"onceguard-1:", "onceguard-2:", "onceguard-3:", `"8081:8080"`, `"8082:8080"`, `"8083:8080"`,
		"dockerfile: deploy/Dockerfile", "- --db\n    - postgres://", "- --redis\n    - redis://redis:6379/0", "- --addr\n    - 0.0.0.0:8080",
		"image: postgres:", "image: redis:", "./grafana/onceguard.json:",
	} {
		if !strings.Contains(compose, want) {
			t.Errorf("docker-compose.yml lacks %q", want)
		}
	}
	prom := read("prometheus/prometheus.yml")
	for _, want := range []string{"onceguard-1:8080", "onceguard-2:8080", "onceguard-3:8080"} {
		if !strings.Contains(prom, want) {
			t.Errorf("prometheus.yml does not scrape %s", want)
		}
	}
	docker := read("Dockerfile")
	for _, want := range []string{"FROM golang:1.26 AS build", "CGO_ENABLED=0", "./cmd/onceguard", "USER nonroot"} {
		if !strings.Contains(docker, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	unit := read("systemd/onceguard@.service")
	for _, want := range []string{"EnvironmentFile=/etc/onceguard/%i.env", "ExecStart=/usr/local/bin/onceguard serve", "[Install]"} {
		if !strings.Contains(unit, want) {
			t.Errorf("onceguard@.service lacks %q", want)
		}
	}
}
