//go:build unix

package main

import (
	"testing"

	"github.com/onceguard/onceguard/internal/dbtest"
)

// Three service processes (the real binary) on one PostgreSQL and one
// Redis, the storms spread across them: they share only the database and
// Redis, where the locks, the window, the keys and the tokens live.
func TestServeStormsThreeInstances(t *testing.T) {
	dbURL := dbtest.FreshPostgres(t, "onceguard_e2e_three")
	redisURL := stormRedis(t)
	bin := buildFaultService(t)
	bases := make([]string, 3)
	for i := range bases {
		bases[i] = startFaultProcess(t, bin, "--addr", "127.0.0.1:0", "--db", dbURL, "--redis", redisURL).base
	}
	stormSuite(t, bases)
}
