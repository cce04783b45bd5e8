package app_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/psp"
	"github.com/onceguard/onceguard/cmd/onceguard/internal/sqlstore"
)

// sessionReads counts how a store is asked about sessions.
type sessionReads struct {
	*sqlstore.Store
	users, lives int
}

func (s *sessionReads) SessionUser(ctx context.Context, hash string, now time.Time) (app.User, error) {
	s.users++
	return s.Store.SessionUser(ctx, hash, now)
}

func (s *sessionReads) SessionLive(ctx context.Context, hash string, now time.Time) error {
	s.lives++
	return s.Store.SessionLive(ctx, hash, now)
}

// A session's user comes from memory after its first request, but every
// request still reads the session: one ended on another instance is
// refused at once, and then forgotten by SessionPrincipal too.
func TestSessionUserSeesAnEndAtOnce(t *testing.T) {
	s, _, _ := withAlice(t)
	ctx := context.Background()
	a, b := &sessionReads{Store: s}, &sessionReads{Store: s}
	svcA := app.New(app.Config{Store: a, Provider: psp.Port(&psp.Sim{}), Currency: "CNY"})
	svcB := app.New(app.Config{Store: b, Provider: psp.Port(&psp.Sim{}), Currency: "CNY"})
	sess, err := svcA.StartSession(ctx, app.User{ID: "u1", Username: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if u, err := svcA.SessionUser(ctx, sess.Token); err != nil || u.ID != "u1" || u.Username != "alice" {
			t.Fatalf("request %d: SessionUser = %+v, %v; want alice", i+1, u, err)
		}
	}
	if a.users != 1 || a.lives != 2 {
		t.Errorf("three requests read the session with its user %d times and alone %d times; want once, then twice alone", a.users, a.lives)
	}
	if err := svcB.EndSession(ctx, sess.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := svcA.SessionUser(ctx, sess.Token); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("after a logout on another instance: SessionUser = %v; want ErrNotFound", err)
	}
	if _, _, err := svcA.SessionPrincipal(ctx, sess.Token); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("after it: SessionPrincipal = %v; want ErrNotFound (forgotten, read again)", err)
	}
	if _, err := svcA.SessionUser(ctx, ""); !errors.Is(err, app.ErrNotFound) {
		t.Errorf("no token: SessionUser = %v; want ErrNotFound", err)
	}
}
