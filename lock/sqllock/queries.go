package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/onceguard/onceguard/sqldialect"
)

// queries holds one dialect's statements. Arguments, in order:
//
//	acquire: key, owner, ttl µs, client now µs (per dialect, see acquire)
//	release: client now µs, key, owner
//	refresh: client now µs, ttl µs, key, owner
//	holder:  client now µs, key -> owner (NULL when free), live
//	cleanup: client now µs, retention µs (a row goes once both its expiry
//	         and its fence are older than that: a fence ahead of the clock,
//	         after the clock stepped back, is kept until the clock passes it)
type queries struct {
	create, release, refresh, holder, cleanup string
	acquire                                   func(ctx context.Context, db *sql.DB, key []byte, owner string, ttl, now int64) (fence int64, won bool, err error)
}

func buildQueries(d sqldialect.Dialect, o Options) (queries, error) {
	t := o.Table
	switch d {
	case sqldialect.Postgres:
		return postgres(t, o.Logged), nil
	case sqldialect.MySQL:
		return mysql(t), nil
	case sqldialect.SQLite:
		return sqlite(t), nil
	}
	return queries{}, fmt.Errorf("sqllock: unknown dialect %v", d)
}

// sub replaces {t} with the table name and {now} with the dialect's clock.
func sub(s, table, now string) string {
	return strings.NewReplacer("{t}", table, "{now}", now).Replace(s)
}

func postgres(t string, logged bool) queries {
	const now = `(extract(epoch from clock_timestamp()) * 1000000)::bigint`
	unlogged := "UNLOGGED "
	if logged {
		unlogged = ""
	}
	// $4 (client now) is unused: the server's clock decides.
	acquire := sub(`INSERT INTO {t} AS l (name, owner, expires_at, fence)
SELECT $1, $2, n + $3, n FROM (SELECT {now} AS n, $4::bigint AS unused) c
ON CONFLICT (name) DO UPDATE
SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, fence = GREATEST(l.fence + 1, EXCLUDED.fence)
WHERE l.owner IS NULL OR l.expires_at <= EXCLUDED.fence
RETURNING l.fence`, t, now)
	return queries{
		create: sub(`CREATE `+unlogged+`TABLE IF NOT EXISTS {t} (
  name bytea PRIMARY KEY,
  owner text,
  expires_at bigint NOT NULL,
  fence bigint NOT NULL
)`, t, now),
		acquire: returning(acquire),
		release: sub(`UPDATE {t} SET owner = NULL WHERE $1::bigint IS NOT NULL AND name = $2 AND owner = $3 AND expires_at > {now}`, t, now),
		refresh: sub(`UPDATE {t} SET expires_at = {now} + $2 WHERE $1::bigint IS NOT NULL AND name = $3 AND owner = $4 AND expires_at > {now}`, t, now),
		holder:  sub(`SELECT owner, expires_at > {now} FROM {t} WHERE $1::bigint IS NOT NULL AND name = $2`, t, now),
		cleanup: sub(`DELETE FROM {t} WHERE expires_at < {now} - $2 AND fence < {now} - $2 AND $1::bigint IS NOT NULL`, t, now),
	}
}

// returning runs an upsert that returns the fence only when it took the row.
//
// On a PostgreSQL whose default isolation is REPEATABLE READ or
// SERIALIZABLE (default_transaction_isolation), the upsert fails with a
// serialization failure (SQLSTATE 40001) when another statement changed
// the row since its snapshot: contention, not an outage. It runs again on
// a new snapshot, and if the row keeps changing the lock is reported held.
func returning(q string) func(context.Context, *sql.DB, []byte, string, int64, int64) (int64, bool, error) {
	return func(ctx context.Context, db *sql.DB, key []byte, owner string, ttl, now int64) (int64, bool, error) {
		for range 3 {
			var fence int64
			err := db.QueryRowContext(ctx, q, key, owner, ttl, now).Scan(&fence)
			if err == sql.ErrNoRows {
				return 0, false, nil
			}
			if err != nil && serializationFailure(err) && ctx.Err() == nil {
				continue
			}
			return fence, err == nil, err
		}
		return 0, false, nil
	}
}

// serializationFailure reports SQLSTATE 40001 (pgx, lib/pq).
func serializationFailure(err error) bool {
	return strings.Contains(err.Error(), "could not serialize access")
}

func sqlite(t string) queries {
	// SQLite runs in the client's process: ?4 is the clock.
	acquire := sub(`INSERT INTO {t} AS l (name, owner, expires_at, fence)
VALUES (?1, ?2, ?4 + ?3, ?4)
ON CONFLICT (name) DO UPDATE
SET owner = excluded.owner, expires_at = excluded.expires_at, fence = max(l.fence + 1, excluded.fence)
WHERE l.owner IS NULL OR l.expires_at <= excluded.fence
RETURNING fence`, t, "")
	return queries{
		create: sub(`CREATE TABLE IF NOT EXISTS {t} (
  name BLOB PRIMARY KEY,
  owner TEXT,
  expires_at INTEGER NOT NULL,
  fence INTEGER NOT NULL
)`, t, ""),
		acquire: returning(acquire),
		release: sub(`UPDATE {t} SET owner = NULL WHERE name = ?2 AND owner = ?3 AND expires_at > ?1`, t, ""),
		refresh: sub(`UPDATE {t} SET expires_at = ?1 + ?2 WHERE name = ?3 AND owner = ?4 AND expires_at > ?1`, t, ""),
		holder:  sub(`SELECT owner, expires_at > ?1 FROM {t} WHERE name = ?2`, t, ""),
		cleanup: sub(`DELETE FROM {t} WHERE expires_at < ?1 - ?2 AND fence < ?1 - ?2`, t, ""),
	}
}

func mysql(t string) queries {
	// Microseconds since the epoch in UTC, whatever the session time zone.
	const now = `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`
	// MySQL has no RETURNING: the fence comes back through
	// LAST_INSERT_ID(expr), which the server reports with the UPDATE's
	// result. The UPDATE changes the row only when it takes it, so one
	// affected row means won whatever clientFoundRows says. A missing row is
	// created free first (a rare extra round trip: rows are kept for
	// Retention).
	take := sub(`UPDATE {t} SET fence = LAST_INSERT_ID(GREATEST(fence + 1, {now})), owner = ?, expires_at = {now} + ?
WHERE name = ? AND (owner IS NULL OR expires_at <= {now})`, t, now)
	held := sub(`SELECT owner IS NOT NULL AND expires_at > {now} FROM {t} WHERE name = ?`, t, now)
	insert := sub(`INSERT IGNORE INTO {t} (name, owner, expires_at, fence) VALUES (?, NULL, {now}, 0)`, t, now)
	return queries{
		create: sub(`CREATE TABLE IF NOT EXISTS {t} (
  name VARBINARY(512) NOT NULL PRIMARY KEY,
  owner VARCHAR(64) NULL,
  expires_at BIGINT NOT NULL,
  fence BIGINT NOT NULL
) ENGINE=InnoDB`, t, now),
		acquire: func(ctx context.Context, db *sql.DB, key []byte, owner string, ttl, _ int64) (int64, bool, error) {
			for range 3 {
				res, err := db.ExecContext(ctx, take, owner, ttl, key)
				if err != nil {
					return 0, false, err
				}
				if n, err := res.RowsAffected(); err != nil || n == 1 {
					fence, ierr := res.LastInsertId()
					return fence, err == nil && ierr == nil, errors.Join(err, ierr)
				}
				// Not taken: held, or no row yet, or freed since the UPDATE
				// looked (then a first-time acquirer may just have created
				// it free). Only a held row is a refusal; else try again.
				var isHeld bool
				switch err := db.QueryRowContext(ctx, held, key).Scan(&isHeld); {
				case err == nil && isHeld:
					return 0, false, nil // held by another owner
				case errors.Is(err, sql.ErrNoRows):
					if _, err := db.ExecContext(ctx, insert, key); err != nil {
						return 0, false, err
					}
				case err != nil:
					return 0, false, err
				}
			}
			return 0, false, nil
		},
		release: sub(`UPDATE {t} SET owner = NULL WHERE ? IS NOT NULL AND name = ? AND owner = ? AND expires_at > {now}`, t, now),
		refresh: sub(`UPDATE {t} SET expires_at = IF(? IS NULL, 0, {now} + ?) WHERE name = ? AND owner = ? AND expires_at > {now}`, t, now),
		holder:  sub(`SELECT owner, expires_at > {now} FROM {t} WHERE ? IS NOT NULL AND name = ?`, t, now),
		cleanup: sub(`DELETE FROM {t} WHERE ? IS NOT NULL AND GREATEST(expires_at, fence) < {now} - ?`, t, now),
	}
}
