package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// User is a user as stored.
type User struct {
	ID, Username, PasswordHash string
}

// UserByName returns the user with username, or ErrNotFound.
func (s *Store) UserByName(ctx context.Context, username string) (User, error) {
	defer s.timed("user_by_name", time.Now())
	u := User{Username: username}
	err := s.db.QueryRowContext(ctx, s.q(`SELECT id, password_hash FROM users WHERE username = ?`), username).Scan(&u.ID, &u.PasswordHash)
	if errors.Is(err, sql.ErrNoRows) {
		return u, ErrNotFound
	}
	return u, err
}

// CreateSession stores a session by its token's hash.
func (s *Store) CreateSession(ctx context.Context, tokenHash, userID string, expiresAt, now int64) error {
	defer s.timed("create_session", time.Now())
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO sessions (token_hash, user_id, expires_at, created_at) VALUES (?, ?, ?, ?)`), tokenHash, userID, expiresAt, now)
	return err
}

// SessionUser returns the user of a live session, or ErrNotFound (unknown,
// expired or deleted).
func (s *Store) SessionUser(ctx context.Context, tokenHash string, now int64) (User, error) {
	defer s.timed("session_user", time.Now())
	var u User
	err := s.db.QueryRowContext(ctx, s.q(`SELECT u.id, u.username FROM sessions s JOIN users u ON u.id = s.user_id WHERE s.token_hash = ? AND s.expires_at > ?`), tokenHash, now).
		Scan(&u.ID, &u.Username)
	if errors.Is(err, sql.ErrNoRows) {
		return u, ErrNotFound
	}
	return u, err
}

// DeleteSession ends a session at once.
func (s *Store) DeleteSession(ctx context.Context, tokenHash string) error {
	defer s.timed("delete_session", time.Now())
	_, err := s.db.ExecContext(ctx, s.q(`DELETE FROM sessions WHERE token_hash = ?`), tokenHash)
	return err
}
