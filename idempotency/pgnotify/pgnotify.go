// Package pgnotify is sqlstore's Listener on the pgx driver: PostgreSQL's
// LISTEN, on a connection of its own made with the settings of the
// caller's *sql.DB (opened with github.com/jackc/pgx/v5/stdlib), so that a
// retry waiting for a key's in-flight first request
// (idempotency.Options.Wait) is woken by the NOTIFY of its completion
// instead of polling. It is a module of its own: users of other drivers
// never download pgx.
package pgnotify

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/onceguard/onceguard/idempotency/sqlstore"
)

// Listener returns a sqlstore.Listener that listens on a connection made
// with the settings of db, a *sql.DB opened with the pgx driver. That
// connection is not one of db's pool (which the waited-for request needs
// to store its answer: a pool of one would deadlock until the store's
// timeout), so it comes on top of db's MaxOpenConns: it is open while
// someone waits, and closed afterwards. The settings are read once, on a
// connection of the pool. Behind PgBouncer in transaction pooling mode,
// give it a *sql.DB opened on PostgreSQL itself: a LISTEN belongs to a
// session, which transaction pooling does not keep, and waiters would
// only find their answers when they ask again (once a second).
func Listener(db *sql.DB) sqlstore.Listener { return &listener{db: db} }

type listener struct {
	db  *sql.DB
	mu  sync.Mutex
	cfg *pgx.ConnConfig // db's, read once
}

// config returns db's connection settings.
func (l *listener) config(ctx context.Context) (*pgx.ConnConfig, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cfg != nil {
		return l.cfg.Copy(), nil
	}
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("the *sql.DB's driver is %T, not pgx's stdlib", dc)
		}
		cfg := c.Conn().Config().Copy()
		// The pool connection's handler buffers into that connection: a
		// connection of its own buffers its own (pgx sets it when nil).
		cfg.OnNotification = nil
		l.cfg = cfg
		return nil
	})
	if err != nil {
		return nil, err
	}
	return l.cfg.Copy(), nil
}

// Listen implements sqlstore.Listener.
func (l *listener) Listen(ctx context.Context, channel string, notify func(string)) (func() error, error) {
	cfg, err := l.config(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgnotify: %w", err)
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgnotify: %w", err)
	}
	if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		_ = c.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("pgnotify: listen: %w", err)
	}
	wait := func() error {
		defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
		for {
			n, err := c.WaitForNotification(ctx)
			if err != nil {
				if errors.Is(err, context.Canceled) && ctx.Err() != nil {
					return nil // stopped: nobody waits any more
				}
				return fmt.Errorf("pgnotify: %w", err)
			}
			notify(n.Payload)
		}
	}
	return wait, nil
}
