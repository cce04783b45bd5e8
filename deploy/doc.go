// Package deploy holds examples of running onceguard, not Go code: a
// Dockerfile, a Compose file with three instances sharing one PostgreSQL
// and one Redis, systemd units, a Prometheus configuration and a Grafana
// dashboard (see README.md). Its test keeps the dashboard's queries to the
// metrics the service exports and the examples' settings to the flags it
// reads, so neither drifts silently.
package deploy
