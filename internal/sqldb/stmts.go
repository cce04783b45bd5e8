package sqldb

import (
	"context"
	"database/sql"
	"sync"
)

// Conn is a database or a transaction.
type Conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Stmts runs each query as a statement prepared once on its database, on
// the database or in a transaction of it: for SQLite (modernc.org/sqlite),
// which otherwise parses every statement it is given, a quarter of a
// withdrawal's CPU. A nil *Stmts runs queries as they are (PostgreSQL's
// pgx caches its own prepared statements).
type Stmts struct {
	db *sql.DB
	m  sync.Map // query -> *sql.Stmt
}

// NewStmts returns Stmts on db.
func NewStmts(db *sql.DB) *Stmts { return &Stmts{db: db} }

// stmt returns query prepared on the database, or nil while it is not
// (the caller runs it as it is). The first call prepares it in the
// background: a caller in a transaction holds a connection, and on a small
// pool (the service keeps four to SQLite) waiting here for another would
// deadlock the pool.
func (p *Stmts) stmt(query string) *sql.Stmt {
	v, loaded := p.m.LoadOrStore(query, nil)
	if st, ok := v.(*sql.Stmt); ok {
		return st
	}
	if !loaded {
		go func() {
			st, err := p.db.PrepareContext(context.Background(), query)
			if err != nil {
				p.m.Delete(query) // tried again on its next use
				return
			}
			p.m.Store(query, st)
		}()
	}
	return nil
}

// Exec runs query on c (the database, or a transaction of it).
func (p *Stmts) Exec(ctx context.Context, c Conn, query string, args ...any) (sql.Result, error) {
	if p != nil {
		if st := p.stmt(query); st != nil {
			if tx, ok := c.(*sql.Tx); ok {
				st = tx.StmtContext(ctx, st)
			}
			return st.ExecContext(ctx, args...)
		}
	}
	return c.ExecContext(ctx, query, args...)
}

// QueryRow runs query on c for one row.
func (p *Stmts) QueryRow(ctx context.Context, c Conn, query string, args ...any) *sql.Row {
	if p != nil {
		if st := p.stmt(query); st != nil {
			if tx, ok := c.(*sql.Tx); ok {
				st = tx.StmtContext(ctx, st)
			}
			return st.QueryRowContext(ctx, args...)
		}
	}
	return c.QueryRowContext(ctx, query, args...)
}
