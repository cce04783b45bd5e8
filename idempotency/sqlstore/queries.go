package sqlstore

import (
	"strings"

	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

type queries struct {
	create                                                       []string
	insertRecord, selectRecord, deleteRecord, takeOver, complete string
	notify, completeNotify                                       string // PostgreSQL with a Listener
	insertNew                                                    string // insertRecord ignoring only an id's conflict; "" on MySQL
	selectLease, bindToken, bindFresh, unbind, unbindAny         string
	tokenRecord                                                  string // the record holding a signed token
	putToken, getToken, claimWindow, selectWindow, freeWindow    string
	prune                                                        []string
	inspect, settle                                              string // the operator's (admin.go)
}

func buildQueries(d sqldialect.Dialect, p string) queries {
	forUpdate := " FOR UPDATE"
	if d == sqldialect.SQLite {
		forUpdate = "" // SQLite serialises writers: the INSERT took the write lock
	}
	q := queries{
		selectRecord: `SELECT fingerprint, state, lease, lease_until, expires_at, status, header, body FROM {p}idempotency WHERE id = ?` + forUpdate,
		deleteRecord: `DELETE FROM {p}idempotency WHERE id = ?`,
		notify:       `SELECT pg_notify(?, ?)`,
		takeOver:     `UPDATE {p}idempotency SET lease = ?, lease_until = ? WHERE id = ?`,
		complete:     `UPDATE {p}idempotency SET state = 2, lease = NULL, status = ?, header = ?, body = ? WHERE id = ? AND state = 1 AND lease = ?`,
		selectLease:  `SELECT token_hash FROM {p}idempotency WHERE id = ? AND state = 1 AND lease = ?` + forUpdate,
		bindToken: `UPDATE {p}submit_tokens SET scope = ?, keep_until = ?
WHERE hash = ? AND subject = ? AND purpose = ? AND ((scope IS NULL AND expires_at > ?) OR scope = ?)`,
		bindFresh: `UPDATE {p}submit_tokens SET scope = ?, keep_until = ?
WHERE hash = ? AND subject = ? AND purpose = ? AND scope IS NULL AND expires_at > ?`,
		unbind:       `UPDATE {p}submit_tokens SET scope = NULL, keep_until = expires_at WHERE hash = ? AND scope = ?`,
		unbindAny:    `UPDATE {p}submit_tokens SET scope = NULL, keep_until = expires_at WHERE hash = ?`,
		putToken:     `INSERT INTO {p}submit_tokens (hash, subject, purpose, expires_at, keep_until) VALUES (?, ?, ?, ?, ?)`,
		getToken:     `SELECT subject, purpose, expires_at, scope FROM {p}submit_tokens WHERE hash = ?`,
		selectWindow: `SELECT owner, expires_at FROM {p}repeat_window WHERE id = ?`,
		tokenRecord:  `SELECT id FROM {p}idempotency WHERE token_hash = ?`,
		freeWindow:   `DELETE FROM {p}repeat_window WHERE id = ? AND owner = ?`,
		inspect:      `SELECT fingerprint, state, lease, lease_until, expires_at, token_hash, status, header, body FROM {p}idempotency WHERE id = ?` + forUpdate,
		settle:       `UPDATE {p}idempotency SET state = 2, lease = NULL, status = ?, header = ?, body = ? WHERE id = ?`,
		prune: []string{
			`DELETE FROM {p}idempotency WHERE expires_at < ?`,
			`DELETE FROM {p}submit_tokens WHERE keep_until < ?`,
			`DELETE FROM {p}repeat_window WHERE expires_at < ?`,
		},
	}
	const cols = `(id, fingerprint, state, lease, lease_until, expires_at, token_hash) VALUES (?, ?, 1, ?, ?, ?, ?)`
	switch d {
	case sqldialect.Postgres:
		q.insertRecord = `INSERT INTO {p}idempotency ` + cols + ` ON CONFLICT (id) DO NOTHING`
		q.insertNew = q.insertRecord
		q.claimWindow = `INSERT INTO {p}repeat_window AS w (id, owner, expires_at) VALUES (?, ?, ?)
ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner,
  expires_at = CASE WHEN w.expires_at <= ? THEN EXCLUDED.expires_at ELSE w.expires_at END
WHERE w.expires_at <= ? OR w.owner = ? OR substr(w.owner, 1, ?) = ?`
		q.create = []string{
			`CREATE TABLE IF NOT EXISTS {p}idempotency (id VARCHAR(255) PRIMARY KEY, fingerprint TEXT NOT NULL, state SMALLINT NOT NULL,
  lease VARCHAR(255), lease_until BIGINT NOT NULL, expires_at BIGINT NOT NULL, token_hash VARCHAR(255),
  status INTEGER, header TEXT, body BYTEA)`,
			`CREATE INDEX IF NOT EXISTS {p}idempotency_expires ON {p}idempotency (expires_at)`,
			`CREATE UNIQUE INDEX IF NOT EXISTS {p}idempotency_token ON {p}idempotency (token_hash)`,
			`CREATE TABLE IF NOT EXISTS {p}submit_tokens (hash VARCHAR(255) PRIMARY KEY, subject VARCHAR(255) NOT NULL,
  purpose VARCHAR(255) NOT NULL, expires_at BIGINT NOT NULL, scope VARCHAR(255), keep_until BIGINT NOT NULL)`,
			`CREATE INDEX IF NOT EXISTS {p}submit_tokens_keep ON {p}submit_tokens (keep_until)`,
			`CREATE TABLE IF NOT EXISTS {p}repeat_window (id VARCHAR(255) PRIMARY KEY, owner VARCHAR(255) NOT NULL, expires_at BIGINT NOT NULL)`,
		}
	case sqldialect.MySQL:
		// Not INSERT IGNORE: on a duplicate it takes a shared lock, and two
		// such transactions upgrading to FOR UPDATE deadlock; the no-op
		// update takes the exclusive lock at once.
		q.insertRecord = `INSERT INTO {p}idempotency ` + cols + ` ON DUPLICATE KEY UPDATE id = id`
		// Assignments run in order: owner's tests the old owner, expiry's the
		// old expiry (owner's does not change it), so a live entry keeps its
		// expiry and passes only to an attempt at the same record.
		q.claimWindow = `INSERT INTO {p}repeat_window (id, owner, expires_at) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE owner = IF(expires_at <= ? OR owner = ? OR SUBSTRING(owner, 1, ?) = ?, VALUES(owner), owner),
  expires_at = IF(expires_at <= ?, VALUES(expires_at), expires_at)`
		q.create = []string{
			`CREATE TABLE IF NOT EXISTS {p}idempotency (id VARCHAR(255) NOT NULL PRIMARY KEY, fingerprint VARCHAR(255) NOT NULL,
  state SMALLINT NOT NULL, lease VARCHAR(255), lease_until BIGINT NOT NULL, expires_at BIGINT NOT NULL,
  token_hash VARCHAR(255), status INT, header TEXT, body LONGBLOB, INDEX {p}idempotency_expires (expires_at)) ENGINE=InnoDB`,
			`CREATE TABLE IF NOT EXISTS {p}submit_tokens (hash VARCHAR(255) NOT NULL PRIMARY KEY, subject VARCHAR(255) NOT NULL,
  purpose VARCHAR(255) NOT NULL, expires_at BIGINT NOT NULL, scope VARCHAR(255), keep_until BIGINT NOT NULL,
  INDEX {p}submit_tokens_keep (keep_until)) ENGINE=InnoDB`,
			`CREATE TABLE IF NOT EXISTS {p}repeat_window (id VARCHAR(255) NOT NULL PRIMARY KEY, owner VARCHAR(255) NOT NULL,
  expires_at BIGINT NOT NULL) ENGINE=InnoDB`,
			// No IF NOT EXISTS: MySQL 8 has none for CREATE INDEX (MariaDB
			// has). Migrate takes its "Duplicate key name" (1061) as done.
			`CREATE UNIQUE INDEX {p}idempotency_token ON {p}idempotency (token_hash)`,
		}
	case sqldialect.SQLite:
		q.insertRecord = `INSERT OR IGNORE INTO {p}idempotency ` + cols
		q.insertNew = `INSERT INTO {p}idempotency ` + cols + ` ON CONFLICT (id) DO NOTHING`
		q.claimWindow = `INSERT INTO {p}repeat_window AS w (id, owner, expires_at) VALUES (?, ?, ?)
ON CONFLICT (id) DO UPDATE SET owner = excluded.owner,
  expires_at = CASE WHEN w.expires_at <= ? THEN excluded.expires_at ELSE w.expires_at END
WHERE w.expires_at <= ? OR w.owner = ? OR substr(w.owner, 1, ?) = ?`
		q.create = []string{
			`CREATE TABLE IF NOT EXISTS {p}idempotency (id TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, state INTEGER NOT NULL,
  lease TEXT, lease_until INTEGER NOT NULL, expires_at INTEGER NOT NULL, token_hash TEXT,
  status INTEGER, header TEXT, body BLOB)`,
			`CREATE INDEX IF NOT EXISTS {p}idempotency_expires ON {p}idempotency (expires_at)`,
			`CREATE UNIQUE INDEX IF NOT EXISTS {p}idempotency_token ON {p}idempotency (token_hash)`,
			`CREATE TABLE IF NOT EXISTS {p}submit_tokens (hash TEXT PRIMARY KEY, subject TEXT NOT NULL, purpose TEXT NOT NULL,
  expires_at INTEGER NOT NULL, scope TEXT, keep_until INTEGER NOT NULL)`,
			`CREATE INDEX IF NOT EXISTS {p}submit_tokens_keep ON {p}submit_tokens (keep_until)`,
			`CREATE TABLE IF NOT EXISTS {p}repeat_window (id TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at INTEGER NOT NULL)`,
		}
	}
	// complete and its NOTIFY in one statement: both or neither, in one
	// round trip (PostgreSQL sends it at commit).
	q.completeNotify = `WITH c AS (` + q.complete + ` RETURNING id) SELECT pg_notify(?, c.id) FROM c`
	fix := func(s string) string {
		s = strings.ReplaceAll(s, "{p}", p)
		if d == sqldialect.Postgres {
			s = sqldb.Rebind(s)
		}
		return s
	}
	for _, sp := range []*string{&q.insertRecord, &q.insertNew, &q.selectRecord, &q.deleteRecord, &q.takeOver, &q.complete, &q.notify, &q.completeNotify,
		&q.selectLease, &q.bindToken, &q.bindFresh, &q.unbind, &q.unbindAny, &q.putToken, &q.getToken,
		&q.claimWindow, &q.selectWindow, &q.tokenRecord, &q.freeWindow, &q.inspect, &q.settle} {
		*sp = fix(*sp)
	}
	for i := range q.create {
		q.create[i] = fix(q.create[i])
	}
	for i := range q.prune {
		q.prune[i] = fix(q.prune[i])
	}
	return q
}
