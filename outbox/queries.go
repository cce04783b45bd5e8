package outbox

import (
	"strings"

	"github.com/onceguard/onceguard/internal/sqldb"
	"github.com/onceguard/onceguard/sqldialect"
)

// queries are the statements of one dialect and table.
type queries struct {
	create []string
	insert string
	// claim: ? claim token, ? lease end, ? now, ? limit. PostgreSQL and
	// SQLite return the claimed rows; MySQL's is an UPDATE, and claimed
	// (? token) reads them.
	claim, claimed string
	sent           string // ? sent_at, ? seq, ? id
	retry          string // ? due_at, ? last_error, ? seq, ? id, ? token
	release        string // ? due_at, ? seq, ? id, ? token
	stats          string
	prune          string // ? cutoff, ? limit
}

const returning = `seq, id, subject, payload, headers, attempts, created_at`

func buildQueries(d sqldialect.Dialect, t string) queries {
	var q queries
	switch d {
	case sqldialect.Postgres:
		q.create = []string{
			`CREATE TABLE IF NOT EXISTS ` + t + ` (
  seq        BIGSERIAL PRIMARY KEY,
  id         VARCHAR(200) NOT NULL,
  subject    VARCHAR(255) NOT NULL,
  payload    BYTEA NOT NULL,
  headers    BYTEA,
  created_at BIGINT NOT NULL,
  due_at     BIGINT NOT NULL,
  attempts   INTEGER NOT NULL DEFAULT 0,
  claim      VARCHAR(64),
  sent_at    BIGINT,
  last_error VARCHAR(500),
  CONSTRAINT ` + t + `_id UNIQUE (id)
)`,
			`CREATE INDEX IF NOT EXISTS ` + t + `_due ON ` + t + ` (due_at) WHERE sent_at IS NULL`,
			`CREATE INDEX IF NOT EXISTS ` + t + `_sent ON ` + t + ` (sent_at) WHERE sent_at IS NOT NULL`,
		}
		q.claim = `UPDATE ` + t + ` SET claim = ?, due_at = ? WHERE seq IN (
  SELECT seq FROM ` + t + ` WHERE sent_at IS NULL AND due_at <= ? ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED
) RETURNING ` + returning
	case sqldialect.MySQL:
		q.create = []string{`CREATE TABLE IF NOT EXISTS ` + t + ` (
  seq        BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  id         VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  subject    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
  payload    LONGBLOB NOT NULL,
  headers    BLOB NULL,
  created_at BIGINT NOT NULL,
  due_at     BIGINT NOT NULL,
  attempts   INT NOT NULL DEFAULT 0,
  claim      VARCHAR(64) NULL,
  sent_at    BIGINT NULL,
  last_error VARCHAR(500) NULL,
  UNIQUE KEY ` + t + `_id (id),
  KEY ` + t + `_due (sent_at, due_at),
  KEY ` + t + `_claim (claim)
) ENGINE=InnoDB`}
		q.claim = `UPDATE ` + t + ` SET claim = ?, due_at = ? WHERE sent_at IS NULL AND due_at <= ? ORDER BY seq LIMIT ?`
		q.claimed = `SELECT ` + returning + ` FROM ` + t + ` WHERE claim = ? AND sent_at IS NULL`
	case sqldialect.SQLite:
		q.create = []string{
			`CREATE TABLE IF NOT EXISTS ` + t + ` (
  seq        INTEGER PRIMARY KEY AUTOINCREMENT,
  id         TEXT NOT NULL UNIQUE,
  subject    TEXT NOT NULL,
  payload    BLOB NOT NULL,
  headers    BLOB,
  created_at INTEGER NOT NULL,
  due_at     INTEGER NOT NULL,
  attempts   INTEGER NOT NULL DEFAULT 0,
  claim      TEXT,
  sent_at    INTEGER,
  last_error TEXT
)`,
			`CREATE INDEX IF NOT EXISTS ` + t + `_due ON ` + t + ` (due_at) WHERE sent_at IS NULL`,
			`CREATE INDEX IF NOT EXISTS ` + t + `_sent ON ` + t + ` (sent_at) WHERE sent_at IS NOT NULL`,
		}
		q.claim = `UPDATE ` + t + ` SET claim = ?, due_at = ? WHERE seq IN (
  SELECT seq FROM ` + t + ` WHERE sent_at IS NULL AND due_at <= ? ORDER BY seq LIMIT ?
) RETURNING ` + returning
	}
	q.insert = `INSERT INTO ` + t + ` (id, subject, payload, headers, created_at, due_at) VALUES (?, ?, ?, ?, ?, ?)`
	q.sent = `UPDATE ` + t + ` SET sent_at = ?, claim = NULL WHERE seq = ? AND id = ? AND sent_at IS NULL`
	q.retry = `UPDATE ` + t + ` SET due_at = ?, attempts = attempts + 1, last_error = ?, claim = NULL WHERE seq = ? AND id = ? AND claim = ? AND sent_at IS NULL`
	q.release = `UPDATE ` + t + ` SET due_at = ?, claim = NULL WHERE seq = ? AND id = ? AND claim = ? AND sent_at IS NULL`
	q.stats = `SELECT COUNT(*), MIN(created_at) FROM ` + t + ` WHERE sent_at IS NULL`
	if d == sqldialect.MySQL {
		q.prune = `DELETE FROM ` + t + ` WHERE sent_at IS NOT NULL AND sent_at < ? ORDER BY sent_at LIMIT ?`
	} else {
		q.prune = `DELETE FROM ` + t + ` WHERE seq IN (SELECT seq FROM ` + t + ` WHERE sent_at IS NOT NULL AND sent_at < ? ORDER BY sent_at LIMIT ?)`
	}
	if d == sqldialect.Postgres {
		for _, p := range []*string{&q.claim, &q.insert, &q.sent, &q.retry, &q.release, &q.prune} {
			*p = sqldb.Rebind(*p)
		}
	}
	return q
}

// truncate cuts s to at most n bytes of valid UTF-8.
func truncate(s string, n int) string {
	if len(s) > n {
		s = s[:n]
	}
	return strings.ToValidUTF8(s, "")
}
