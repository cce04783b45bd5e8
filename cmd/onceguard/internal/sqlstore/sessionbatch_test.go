package sqlstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
)

// Concurrent session checks on PostgreSQL with BatchSessions share a statement, and each gets
// its own answer: a live session is live, one expired, ended or unknown is not, whatever the
// others in its batch are, the same session twice included.
func TestSessionLiveBatched(t *testing.T) {
	s, _, now := withUserDB(t, databases[0])
	s.BatchSessions = true
	ctx := context.Background()
	at := time.UnixMicro(now)
	for hash, expires := range map[string]time.Time{"live1": at.Add(time.Hour), "live2": at.Add(time.Hour), "old": at, "gone": at.Add(time.Hour)} {
		if err := s.CreateSession(ctx, hash, "u1", expires, at); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteSession(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.HoldSessionBatches(func() { once.Do(func() { close(held); <-release }) })

	checks := []struct {
		hash string
		live bool
	}{{"live1", true}, {"live2", true}, {"old", false}, {"gone", false}, {"unknown", false}, {"live1", true}, {"live2", true}, {"old", false}}
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	check := func(i int) {
		defer wg.Done()
		errs[i] = s.SessionLive(ctx, checks[i].hash, at)
	}
	wg.Add(len(checks))
	go check(0) // its batch, of one, is held while the others queue behind it
	<-held
	for i := 1; i < len(checks); i++ {
		go check(i)
	}
	for deadline := time.Now().Add(10 * time.Second); s.SessionChecksQueued() < len(checks)-1; {
		if time.Now().After(deadline) {
			t.Fatalf("%d checks queued behind the held batch; want %d", s.SessionChecksQueued(), len(checks)-1)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	for i, c := range checks {
		switch {
		case c.live && errs[i] != nil:
			t.Errorf("check %d (%s): %v; want live", i, c.hash, errs[i])
		case !c.live && !errors.Is(errs[i], app.ErrNotFound):
			t.Errorf("check %d (%s): %v; want ErrNotFound", i, c.hash, errs[i])
		}
	}
	if batches, n := s.SessionBatches(); batches != 1 || n != int64(len(checks)-1) {
		t.Errorf("%d statements checked %d sessions; want one that checked the %d queued", batches, n, len(checks)-1)
	}
}

// Two checks of one session in one batch, at two times, the session expiring between them: each
// is answered at its own request's time, as a check alone is (the later one is not live).
func TestSessionLiveBatchedPerCheckTime(t *testing.T) {
	s, _, now := withUserDB(t, databases[0])
	s.BatchSessions = true
	ctx := context.Background()
	at := time.UnixMicro(now)
	expires := at.Add(time.Hour)
	if err := s.CreateSession(ctx, "sess", "u1", expires, at); err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.HoldSessionBatches(func() { once.Do(func() { close(held); <-release }) })
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.SessionLive(ctx, "other", at) }) // its batch, of one, is held
	<-held
	nows := []time.Time{expires.Add(-time.Millisecond), expires.Add(time.Millisecond)} // live, then expired
	errs := make([]error, len(nows))
	for i, now := range nows {
		wg.Go(func() { errs[i] = s.SessionLive(ctx, "sess", now) })
	}
	for deadline := time.Now().Add(10 * time.Second); s.SessionChecksQueued() < len(nows); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the checks never queued")
		}
	}
	close(release)
	wg.Wait()
	if batches, n := s.SessionBatches(); batches != 1 || n != 2 {
		t.Fatalf("%d batches of %d checks; want the two in one", batches, n)
	}
	if errs[0] != nil {
		t.Errorf("SessionLive(before its expiry) = %v; want live", errs[0])
	}
	if !errors.Is(errs[1], app.ErrNotFound) {
		t.Errorf("SessionLive(after its expiry) = %v; want app.ErrNotFound, as a check alone answers", errs[1])
	}
}
