package storetest_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/idempotency/memstore"
	"github.com/onceguard/onceguard/idempotency/sqlstore"
	"github.com/onceguard/onceguard/idempotency/storetest"
	"github.com/onceguard/onceguard/sqldialect"
)

// A store proves itself by running the suite from its own tests, here the
// in-process memstore.Store, with a fresh store for each subtest.
func ExampleRun() {
	// func TestStore(t *testing.T), in the store's _test.go file:
	testStore := func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) idemstore.FullStore { return &memstore.Store{} })
	}
	_ = testStore
}

// Ids are unique per run, so every subtest can share one store on one
// database: here sqlstore on a SQLite file (WAL and a busy timeout, for
// the suite's concurrent requests).
func ExampleRun_sharedDatabase() {
	// func TestStore(t *testing.T), in the store's _test.go file:
	testStore := func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "idem.db")
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		s, err := sqlstore.New(db, sqldialect.SQLite, nil)
		if err != nil {
			t.Fatal(err)
		}
		storetest.Run(t, func(*testing.T) idemstore.FullStore { return s })
	}
	_ = testStore
}
