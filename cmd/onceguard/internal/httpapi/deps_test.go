package httpapi_test

import (
	"slices"
	"testing"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/depcheck"
)

// The HTTP layer decodes, calls the domain and encodes: nothing on its
// import graph is the service's store or a lock backend, and none of this
// module's packages on it imports database/sql (a third-party package
// may: Prometheus's collectors do).
func TestHTTPDependsOnNoStore(t *testing.T) {
	banned := []string{
		depcheck.Module + "/cmd/onceguard/internal/sqlstore",
		depcheck.Module + "/lock/redislock", depcheck.Module + "/lock/redlock", depcheck.Module + "/lock/sqllock",
		depcheck.Module + "/lock/fallback", depcheck.Module + "/lock/memlock", depcheck.Module + "/lock/rueidislock",
	}
	for _, p := range depcheck.Graph(t, depcheck.Module+"/cmd/onceguard/internal/httpapi") {
		if slices.Contains(banned, p.Path) {
			t.Errorf("internal/httpapi depends on %s; want no store and no lock backend", p.Path)
		}
		if depcheck.Ours(p.Path) && slices.Contains(p.Imports, "database/sql") {
			t.Errorf("%s, on internal/httpapi's import graph, imports database/sql", p.Path)
		}
	}
}
