package sqldb_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"testing"
	"time"

	"github.com/onceguard/onceguard/internal/sqldb"
)

// txDriver is a database/sql driver whose connections only begin,
// commit and roll back.
type txDriver struct{}

func (txDriver) Open(string) (driver.Conn, error) { return txConn{}, nil }

type txConn struct{}

func (txConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("no statements") }
func (txConn) Close() error                        { return nil }
func (txConn) Begin() (driver.Tx, error)           { return txConn{}, nil }
func (txConn) Commit() error                       { return nil }
func (txConn) Rollback() error                     { return nil }

func init() { sql.Register("sqldb-tx", txDriver{}) }

// One write transaction at a time: a second Begin waits for the first's
// done, a waiting Begin gives up with its context, done twice frees one
// place, and a nil gate never waits.
func TestWriteGate(t *testing.T) {
	db, err := sql.Open("sqldb-tx", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	g := sqldb.NewWriteGate()
	tx1, done1, err := g.Begin(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	began := make(chan func())
	go func() {
		tx2, done2, err := g.Begin(ctx, db)
		if err != nil {
			t.Error(err)
			close(began)
			return
		}
		_ = tx2.Commit()
		began <- done2
	}()
	select {
	case <-began:
		t.Fatal("a second write transaction began while the first was open")
	case <-time.After(50 * time.Millisecond):
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := g.Begin(cctx, db); !errors.Is(err, context.Canceled) {
		t.Errorf("Begin with a cancelled context while the gate is held = %v; want context.Canceled", err)
	}
	_ = tx1.Commit()
	done1()
	done1() // a second call frees nothing more
	var done2 func()
	select {
	case done2 = <-began:
	case <-time.After(10 * time.Second):
		t.Fatal("the second write transaction never began after the first was done")
	}
	if done2 == nil {
		t.FailNow()
	}
	wctx, wcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer wcancel()
	if _, _, err := g.Begin(wctx, db); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Begin while the second holds the gate = %v; want it to wait (DeadlineExceeded): the first's second done freed a place", err)
	}
	done2()
	var none *sqldb.WriteGate
	for range 2 {
		tx, done, err := none.Begin(ctx, db)
		if err != nil {
			t.Fatalf("nil gate: %v", err)
		}
		defer done()
		defer tx.Rollback()
	}
}
