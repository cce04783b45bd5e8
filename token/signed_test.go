package token_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/token"
)

// nothingStore fails every call: signed tokens must not reach a store.
type nothingStore struct{ t *testing.T }

func (s nothingStore) PutToken(context.Context, token.Record) error {
	s.t.Error("PutToken called for a signed token")
	return nil
}
func (s nothingStore) GetToken(context.Context, string) (token.Record, error) {
	s.t.Error("GetToken called for a signed token")
	return token.Record{}, token.ErrUnknown
}
func (s nothingStore) BindToken(context.Context, string, string, string, string, time.Time) (bool, error) {
	s.t.Error("BindToken called for a signed token")
	return false, nil
}
func (s nothingStore) UnbindToken(context.Context, string, string) error { return nil }

// A signed token is minted without the store and verified from its
// signature alone: for its subject and purpose until it expires; another
// subject's is ErrForeign, another purpose, a changed character or
// another key's ErrUnknown, a late one ErrExpired.
func TestSigned(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	key := []byte(strings.Repeat("k", 32))
	tk := token.New(nothingStore{t}, &token.Options{Key: key, TTL: time.Minute, Now: func() time.Time { return now }})
	if !tk.Signed() {
		t.Fatal("Signed() = false")
	}
	is, err := tk.Issue(context.Background(), "alice", "withdrawal")
	if err != nil || !token.IsToken(is.Token) || len(is.Token) > 64 {
		t.Fatalf("Issue = %+v, %v", is, err)
	}
	if err := tk.Verify(is.Token, "alice", "withdrawal"); err != nil {
		t.Fatalf("Verify = %v; want nil", err)
	}
	flip := []byte(is.Token)
	flip[len(flip)-5] ^= 1
	other := token.New(nothingStore{t}, &token.Options{Key: []byte(strings.Repeat("o", 32)), Now: func() time.Time { return now }})
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"another subject", tk.Verify(is.Token, "bob", "withdrawal"), token.ErrForeign},
		{"another purpose", tk.Verify(is.Token, "alice", "order"), token.ErrUnknown},
		{"a changed character", tk.Verify(string(flip), "alice", "withdrawal"), token.ErrUnknown},
		{"another key", other.Verify(is.Token, "alice", "withdrawal"), token.ErrForeign},
		{"a stored token's shape", tk.Verify("st_"+strings.Repeat("a", 32), "alice", "withdrawal"), token.ErrUnknown},
	} {
		if !errors.Is(c.err, c.want) || !errors.Is(c.err, token.ErrInvalid) {
			t.Errorf("%s: %v; want %v", c.name, c.err, c.want)
		}
	}
	now = now.Add(time.Minute)
	if err := tk.Verify(is.Token, "alice", "withdrawal"); !errors.Is(err, token.ErrExpired) {
		t.Errorf("after its TTL: %v; want ErrExpired", err)
	}
}

// A token minted by an earlier release (this one by the code before the
// pooled HMACs, key "g"×32, at 1 800 000 000 with a minute's TTL) still
// verifies: instances of two versions side by side, during a rolling
// deploy, accept each other's tokens.
func TestSignedFormatStable(t *testing.T) {
	const minted = "st_a0nSPF3iLGMjBwCQyqxyfjUJaTP1LBe-6CjEEVHEJ9A"
	at := time.Unix(1_800_000_030, 0)
	tk := token.New(nothingStore{t}, &token.Options{Key: []byte(strings.Repeat("g", 32)), Now: func() time.Time { return at }})
	if err := tk.Verify(minted, "u_gold", "withdrawal"); err != nil {
		t.Fatalf("Verify(earlier token) = %v; want nil", err)
	}
	if err := tk.Verify(minted, "u_gold", "order"); !errors.Is(err, token.ErrUnknown) {
		t.Errorf("for another purpose = %v; want ErrUnknown", err)
	}
	if err := tk.Verify(minted, "u_other", "withdrawal"); !errors.Is(err, token.ErrForeign) {
		t.Errorf("for another subject = %v; want ErrForeign", err)
	}
}

// Concurrent mints and checks for different subjects share the pooled
// MACs without mixing their messages: each token verifies for its own
// subject only (run with -race).
func TestSignedConcurrent(t *testing.T) {
	tk := token.New(nothingStore{t}, &token.Options{Key: []byte(strings.Repeat("k", 32))})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			me, other := fmt.Sprint("user-", g), fmt.Sprint("user-", g+1)
			for range 200 {
				is, err := tk.Issue(context.Background(), me, "withdrawal")
				if err != nil {
					t.Error(err)
					return
				}
				if err := tk.Verify(is.Token, me, "withdrawal"); err != nil {
					t.Errorf("Verify(own) = %v", err)
					return
				}
				if err := tk.Verify(is.Token, other, "withdrawal"); err == nil {
					t.Errorf("Verify(%s's token as %s) = nil", me, other)
					return
				}
			}
		}()
	}
	wg.Wait()
}
