// Package tokentest is the conformance suite every token.Store runs:
//
//	func TestTokens(t *testing.T) {
//		tokentest.Run(t, func(t *testing.T) token.Store { return newStore(t) })
//	}
package tokentest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceguard/onceguard/token"
)

// Run runs the suite; newStore is called once per subtest.
func Run(t *testing.T, newStore func(t *testing.T) token.Store) {
	ctx := context.Background()
	subject := func(t *testing.T) string { return fmt.Sprintf("user-%s-%d", t.Name(), time.Now().UnixNano()) }

	t.Run("IssueFormat", func(t *testing.T) {
		tk := token.New(newStore(t), nil)
		seen := map[string]bool{}
		for range 100 {
			is, err := tk.Issue(ctx, subject(t), "withdrawal")
			if err != nil {
				t.Fatalf("Issue = %v", err)
			}
			if !token.IsToken(is.Token) || len(is.Token) < 32 || seen[is.Token] {
				t.Fatalf("Issue gave %q; want a fresh st_ token of at least 32 characters", is.Token)
			}
			seen[is.Token] = true
		}
		if _, err := tk.Issue(ctx, "", "withdrawal"); err == nil {
			t.Error("Issue with no subject = nil error; want an error")
		}
		if _, err := tk.Issue(ctx, subject(t), ""); err == nil {
			t.Error("Issue with no purpose = nil error; want an error (a token for nothing would pass any purpose check that compares empty strings)")
		}
	})

	t.Run("StoredHashed", func(t *testing.T) {
		s := newStore(t)
		tk := token.New(s, nil)
		is, _ := tk.Issue(ctx, subject(t), "order")
		if _, err := s.GetToken(ctx, is.Token); !errors.Is(err, token.ErrUnknown) {
			t.Errorf("GetToken(raw token) = %v; want ErrUnknown (only the hash is stored)", err)
		}
		if r, err := s.GetToken(ctx, token.Hash(is.Token)); err != nil || r.Hash != token.Hash(is.Token) {
			t.Errorf("GetToken(hash) = %+v, %v; want the record", r, err)
		}
	})

	t.Run("Refusals", func(t *testing.T) {
		now := time.Now()
		clock := func() time.Time { return now }
		tk := token.New(newStore(t), &token.Options{TTL: time.Minute, Now: clock})
		alice, bob := subject(t)+"a", subject(t)+"b"
		is, err := tk.Issue(ctx, alice, "withdrawal")
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name                    string
			tok, subj, purpose, scp string
			want                    error
		}{
			{"unknown", "st_nope", alice, "withdrawal", "s1", token.ErrUnknown},
			{"not a token", "abc", alice, "withdrawal", "s1", token.ErrUnknown},
			{"foreign", is.Token, bob, "withdrawal", "s1", token.ErrForeign},
			{"purpose", is.Token, alice, "deposit", "s1", token.ErrPurpose},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if err := tk.Check(ctx, tc.tok, tc.subj, tc.purpose, tc.scp); !errors.Is(err, tc.want) || !errors.Is(err, token.ErrInvalid) {
					t.Errorf("Check = %v; want %v (and ErrInvalid)", err, tc.want)
				}
				if fresh, err := tk.Consume(ctx, tc.tok, tc.subj, tc.purpose, tc.scp); fresh || !errors.Is(err, tc.want) {
					t.Errorf("Consume = %v, %v; want false, %v", fresh, err, tc.want)
				}
			})
		}
		// None of the refusals burnt it.
		if fresh, err := tk.Consume(ctx, is.Token, alice, "withdrawal", "s1"); !fresh || err != nil {
			t.Fatalf("Consume by its owner after refusals = %v, %v; want true, nil", fresh, err)
		}
		if fresh, err := tk.Consume(ctx, is.Token, alice, "withdrawal", "s1"); fresh || err != nil {
			t.Errorf("Consume again in the same scope = %v, %v; want false, nil", fresh, err)
		}
		if _, err := tk.Consume(ctx, is.Token, alice, "withdrawal", "s2"); !errors.Is(err, token.ErrUsed) {
			t.Errorf("Consume in another scope = %v; want ErrUsed", err)
		}
		// Bound tokens do not expire with the TTL; unused ones do.
		now = now.Add(2 * time.Minute)
		if err := tk.Check(ctx, is.Token, alice, "withdrawal", "s1"); err != nil {
			t.Errorf("Check of a bound token after its TTL = %v; want nil", err)
		}
		unused, _ := tk.Issue(ctx, alice, "withdrawal")
		now = now.Add(2 * time.Minute)
		if _, err := tk.Consume(ctx, unused.Token, alice, "withdrawal", "s3"); !errors.Is(err, token.ErrExpired) {
			t.Errorf("Consume after the TTL = %v; want ErrExpired", err)
		}
	})

	t.Run("Release", func(t *testing.T) {
		tk := token.New(newStore(t), nil)
		u := subject(t)
		is, _ := tk.Issue(ctx, u, "payment")
		if fresh, err := tk.Consume(ctx, is.Token, u, "payment", "order/A"); !fresh || err != nil {
			t.Fatalf("Consume = %v, %v", fresh, err)
		}
		if err := tk.Release(ctx, is.Token, "order/B"); err != nil {
			t.Fatalf("Release in another scope = %v", err)
		}
		if _, err := tk.Consume(ctx, is.Token, u, "payment", "order/B"); !errors.Is(err, token.ErrUsed) {
			t.Errorf("Consume elsewhere after a Release in the wrong scope = %v; want ErrUsed", err)
		}
		if err := tk.Release(ctx, is.Token, "order/A"); err != nil {
			t.Fatalf("Release = %v", err)
		}
		if fresh, err := tk.Consume(ctx, is.Token, u, "payment", "order/B"); !fresh || err != nil {
			t.Errorf("Consume after Release = %v, %v; want true, nil", fresh, err)
		}
	})

	t.Run("ConsumeRace", func(t *testing.T) {
		tk := token.New(newStore(t), nil)
		u := subject(t)
		is, _ := tk.Issue(ctx, u, "withdrawal")
		const n = 200
		var fresh, same, used atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				scope := "withdrawals"
				if i%2 == 1 {
					scope = fmt.Sprintf("elsewhere/%d", i)
				}
				f, err := tk.Consume(ctx, is.Token, u, "withdrawal", scope)
				switch {
				case err == nil && f:
					fresh.Add(1)
				case err == nil:
					same.Add(1)
				case errors.Is(err, token.ErrUsed):
					used.Add(1)
				default:
					t.Errorf("Consume = %v", err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if fresh.Load() != 1 {
			t.Errorf("%d of %d concurrent consumers bound the token; want exactly 1 (same scope %d, refused %d)", fresh.Load(), n, same.Load(), used.Load())
		}
	})
}
