package natsjs_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceguard/onceguard/internal/natstest"
	"github.com/onceguard/onceguard/natsjs"
	"github.com/onceguard/onceguard/outbox"
)

// An existing stream whose MaxAge is under the 10-minute window (an operator's retention):
// EnsureStream cannot give it a 10-minute window (JetStream refuses a window above MaxAge),
// and must not make every publish fail forever because of it: it takes the longest window
// the stream allows, and events flow.
func TestEnsureStreamShortMaxAge(t *testing.T) {
	_, js := pubConnect(t, natstest.URL(t))
	name, prefix := pubStream(t, js)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"}, MaxAge: 5 * time.Minute, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	p, _ := natsjs.NewPublisher(js, &natsjs.PublisherOptions{Stream: &jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"}}})
	for range 2 {
		if err := p.Publish(ctx, outbox.Message{ID: "evt_a", Subject: prefix + ".x"}); err != nil {
			t.Fatalf("Publish to a stream with MaxAge 5m = %v; want it published (the window capped at 5m)", err)
		}
	}
	n, ids := pubCount(t, js, name)
	s, _ := js.Stream(ctx, name)
	if d := s.CachedInfo().Config.Duplicates; n != 1 || ids["evt_a"] != 1 || d != 5*time.Minute {
		t.Errorf("stream holds %d (%v), window %v; want evt_a once, window 5m", n, ids, d)
	}
}
