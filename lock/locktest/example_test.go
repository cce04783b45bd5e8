package locktest_test

import (
	"database/sql"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/locktest"
	"github.com/onceguard/onceguard/lock/memlock"
	"github.com/onceguard/onceguard/lock/redislock"
	"github.com/onceguard/onceguard/lock/sqllock"
	"github.com/onceguard/onceguard/sqldialect"
)

// A backend proves itself by running the suite from its own tests, here
// the in-process memlock.Backend, with a fresh backend for each subtest.
func ExampleRun() {
	// func TestConformance(t *testing.T), in the backend's _test.go file:
	testConformance := func(t *testing.T) {
		locktest.Run(t, func(t *testing.T) lock.Backend { return &memlock.Backend{} })
	}
	_ = testConformance
}

// A backend on a server runs the suite against it, and skips where none is
// named. Keys are unique per run, so one client can serve every subtest and
// several runs can share the server.
func ExampleRun_server() {
	// func TestConformance(t *testing.T), in the backend's _test.go file:
	testConformance := func(t *testing.T) {
		url := os.Getenv("ONCEGUARD_TEST_REDIS") // e.g. redis://127.0.0.1:6379/0
		if url == "" {
			t.Skip("ONCEGUARD_TEST_REDIS not set")
		}
		opt, err := redis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(opt)
		t.Cleanup(func() { _ = rdb.Close() })
		locktest.Run(t, func(*testing.T) lock.Backend { return redislock.New(rdb, nil) })
	}
	_ = testConformance
}

// The suite fails a subtest that leaves a goroutine behind; the leak
// options name the ones a driver starts legitimately as its pool grows,
// here go-sql-driver/mysql's per-connection watcher.
func ExampleRun_leak() {
	// func TestConformance(t *testing.T), in the backend's _test.go file:
	testConformance := func(t *testing.T) {
		dsn := os.Getenv("ONCEGUARD_TEST_MYSQL") // e.g. root@tcp(127.0.0.1:3306)/test
		if dsn == "" {
			t.Skip("ONCEGUARD_TEST_MYSQL not set")
		}
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		b, err := sqllock.New(db, sqldialect.MySQL, nil)
		if err != nil {
			t.Fatal(err)
		}
		locktest.Run(t, func(*testing.T) lock.Backend { return b },
			"github.com/go-sql-driver/mysql.(*mysqlConn).startWatcher.func1")
	}
	_ = testConformance
}
