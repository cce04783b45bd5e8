package app_test

import (
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/depcheck"
)

// The domain knows no transport and no database: neither net/http nor
// database/sql is anywhere on its import graph.
func TestDomainDependsOnNoTransport(t *testing.T) {
	for _, p := range depcheck.Graph(t, depcheck.Module+"/cmd/onceguard/internal/app") {
		switch p.Path {
		case "net/http", "database/sql":
			t.Errorf("internal/app depends on %s; want no transport and no database", p.Path)
		}
	}
}
