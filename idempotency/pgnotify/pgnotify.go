// Package pgnotify is sqlstore's Listener on the pgx driver: PostgreSQL's
// LISTEN, on a connection of the caller's *sql.DB (opened with
// github.com/jackc/pgx/v5/stdlib), so that a retry waiting for a key's
// in-flight first request (idempotency.Options.Wait) is woken by the
// NOTIFY of its completion instead of polling. It is a module of its own:
// users of other drivers never download pgx.
package pgnotify

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/onceguard/onceguard/idempotency/sqlstore"
)

// Listener returns a sqlstore.Listener that listens on a connection of
// db, a *sql.DB opened with the pgx driver. The connection is taken from
// db's pool while someone waits, and closed (not returned) afterwards.
func Listener(db *sql.DB) sqlstore.Listener { return listener{db} }

type listener struct{ db *sql.DB }

// Listen implements sqlstore.Listener.
func (l listener) Listen(ctx context.Context, channel string, notify func(string)) (func() error, error) {
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgnotify: %w", err)
	}
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("pgnotify: the *sql.DB's driver is %T, not pgx's stdlib", dc)
		}
		_, err := c.Conn().Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
		return err
	})
	if err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // drop it, LISTEN and all
		_ = conn.Close()
		return nil, fmt.Errorf("pgnotify: listen: %w", err)
	}
	wait := func() error {
		defer conn.Close()
		var cause error
		_ = conn.Raw(func(dc any) error {
			c := dc.(*stdlib.Conn).Conn()
			for {
				n, err := c.WaitForNotification(ctx)
				if err != nil {
					cause = err
					// The connection listens (or was cut mid-wait): never
					// hand it back to the pool.
					return driver.ErrBadConn
				}
				notify(n.Payload)
			}
		})
		if errors.Is(cause, context.Canceled) && ctx.Err() != nil {
			return nil // stopped: nobody waits any more
		}
		return fmt.Errorf("pgnotify: %w", cause)
	}
	return wait, nil
}
