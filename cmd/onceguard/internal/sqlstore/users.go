package sqlstore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/sqldialect"
)

// CreateUser adds a user with an empty account in currency.
func (s *Store) CreateUser(ctx context.Context, u app.User, currency string) (err error) {
	defer s.timed("create_user", time.Now(), &err)
	now := us(u.CreatedAt)
	return s.gate.Run(ctx, s.db, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO users (id, username, password_hash, created_at) VALUES (?, ?, ?, ?)`), u.ID, u.Username, u.PasswordHash, now); duplicate(err) {
			return app.ErrUsernameTaken
		} else if err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO accounts (user_id, balance, currency, version, updated_at) VALUES (?, 0, ?, 0, ?)`), u.ID, currency, now)
		return err
	})
}

// UserByName returns the user with username, or app.ErrNotFound.
func (s *Store) UserByName(ctx context.Context, username string) (u app.User, err error) {
	defer s.timed("user_by_name", time.Now(), &err)
	u.Username = username
	err = s.db.QueryRowContext(ctx, s.q(`SELECT id, password_hash FROM users WHERE username = ?`), username).Scan(&u.ID, &u.PasswordHash)
	if errors.Is(err, sql.ErrNoRows) {
		return u, app.ErrNotFound
	}
	return u, err
}

// CreateSession stores a session by its token's hash.
func (s *Store) CreateSession(ctx context.Context, tokenHash, userID string, expiresAt, now time.Time) (err error) {
	defer s.timed("create_session", time.Now(), &err)
	_, err = s.db.ExecContext(ctx, s.q(`INSERT INTO sessions (token_hash, user_id, expires_at, created_at) VALUES (?, ?, ?, ?)`), tokenHash, userID, us(expiresAt), us(now))
	return err
}

// SessionUser returns the user of a live session, or app.ErrNotFound (unknown,
// expired or deleted).
func (s *Store) SessionUser(ctx context.Context, tokenHash string, now time.Time) (u app.User, err error) {
	defer s.timed("session_user", time.Now(), &err)
	err = s.db.QueryRowContext(ctx, s.q(`SELECT u.id, u.username FROM sessions s JOIN users u ON u.id = s.user_id WHERE s.token_hash = ? AND s.expires_at > ?`), tokenHash, us(now)).
		Scan(&u.ID, &u.Username)
	if errors.Is(err, sql.ErrNoRows) {
		return u, app.ErrNotFound
	}
	return u, err
}

// SessionLive returns nil for a live session, app.ErrNotFound for one unknown, expired or
// deleted.
func (s *Store) SessionLive(ctx context.Context, tokenHash string, now time.Time) (err error) {
	defer s.timed("session_live", time.Now(), &err)
	if s.d == sqldialect.Postgres && s.BatchSessions {
		return s.sessionLiveBatched(ctx, tokenHash, now)
	}
	return s.sessionLiveOne(ctx, tokenHash, now)
}

// sessionLiveOne is SessionLive in a statement of its own.
func (s *Store) sessionLiveOne(ctx context.Context, tokenHash string, now time.Time) error {
	var one int
	err := s.db.QueryRowContext(ctx, s.q(`SELECT 1 FROM sessions WHERE token_hash = ? AND expires_at > ?`), tokenHash, us(now)).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return app.ErrNotFound
	}
	return err
}

// DeleteSession ends a session at once.
func (s *Store) DeleteSession(ctx context.Context, tokenHash string) (err error) {
	defer s.timed("delete_session", time.Now(), &err)
	_, err = s.db.ExecContext(ctx, s.q(`DELETE FROM sessions WHERE token_hash = ?`), tokenHash)
	return err
}

// Secret returns the service's secret name, 32 random bytes made by the
// first caller on this database and read by every later one (every
// instance gets the same).
func (s *Store) Secret(ctx context.Context, name string) (key []byte, err error) {
	defer s.timed("secret", time.Now(), &err)
	var b [32]byte
	_, _ = rand.Read(b[:])
	insert := `INSERT INTO service_secrets (name, secret) VALUES (?, ?) ON CONFLICT (name) DO NOTHING`
	if s.d == sqldialect.MySQL {
		insert = `INSERT IGNORE INTO service_secrets (name, secret) VALUES (?, ?)`
	}
	if _, err := s.db.ExecContext(ctx, s.q(insert), name, hex.EncodeToString(b[:])); err != nil {
		return nil, err
	}
	var h string
	if err := s.db.QueryRowContext(ctx, s.q(`SELECT secret FROM service_secrets WHERE name = ?`), name).Scan(&h); err != nil {
		return nil, err
	}
	return hex.DecodeString(h)
}
