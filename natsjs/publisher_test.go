package natsjs_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/onceguard/onceguard/internal/natstest"
	"github.com/onceguard/onceguard/natsjs"
	"github.com/onceguard/onceguard/outbox"
)

var pubStreams atomic.Int64

// pubStream names a stream and a subject prefix of its own on the shared
// server, and deletes the stream when t ends.
func pubStream(t *testing.T, js jetstream.JetStream) (name, prefix string) {
	t.Helper()
	n := fmt.Sprintf("%d_%d", time.Now().UnixNano()%1e9, pubStreams.Add(1))
	name, prefix = "NATSJSTEST_"+n, "natsjstest."+n
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
	return name, prefix
}

func pubConnect(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// pubCount returns how many messages the stream holds, and how many carry
// each Nats-Msg-Id.
func pubCount(t *testing.T, js jetstream.JetStream, stream string) (int, map[string]int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		} else if err != nil {
			t.Fatalf("get message %d: %v", seq, err)
		}
		ids[m.Header.Get(jetstream.MsgIDHeader)]++
	}
	return int(info.State.Msgs), ids
}

func TestPublishDeduplicatesByID(t *testing.T) {
	_, js := pubConnect(t, natstest.URL(t))
	name, prefix := pubStream(t, js)
	p, err := natsjs.NewPublisher(js, &natsjs.PublisherOptions{Stream: &jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".>"}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m := outbox.Message{ID: "evt_1", Subject: prefix + ".thing.done", Payload: []byte(`{"x":1}`), Headers: map[string][]string{"X-Trace": {"abc"}}}
	for range 3 { // a relay that lost the ack publishes again: the stream stores one
		if err := p.Publish(ctx, m); err != nil {
			t.Fatalf("Publish = %v", err)
		}
	}
	if err := p.Publish(ctx, outbox.Message{ID: "evt_2", Subject: prefix + ".thing.done", Payload: []byte(`{"x":2}`)}); err != nil {
		t.Fatal(err)
	}
	n, ids := pubCount(t, js, name)
	if n != 2 || ids["evt_1"] != 1 || ids["evt_2"] != 1 {
		t.Errorf("stream holds %d messages, by id %v; want evt_1 and evt_2 once each", n, ids)
	}
	s, _ := js.Stream(ctx, name)
	got, err := s.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Data) != `{"x":1}` || got.Header.Get("X-Trace") != "abc" || got.Subject != prefix+".thing.done" {
		t.Errorf("stored message = %s %q %v; want the payload, subject and headers published", got.Subject, got.Data, got.Header)
	}
	if d := s.CachedInfo().Config.Duplicates; d < 10*time.Minute {
		t.Errorf("the stream's duplicates window = %v; want at least 10m", d)
	}
}

func TestPublishWithoutStreamFails(t *testing.T) {
	_, js := pubConnect(t, natstest.URL(t))
	_, prefix := pubStream(t, js)
	p, err := natsjs.NewPublisher(js, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// No stream binds the subject: no PubAck, so not a success.
	if err := p.Publish(ctx, outbox.Message{ID: "evt_x", Subject: prefix + ".nowhere"}); err == nil {
		t.Error("Publish to a subject no stream binds = nil; want an error")
	}
}

func TestEnsureStreamAddsWhatIsMissing(t *testing.T) {
	_, js := pubConnect(t, natstest.URL(t))
	name, prefix := pubStream(t, js)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".theirs.>"}, Duplicates: time.Minute, MaxMsgs: 1000}); err != nil {
		t.Fatal(err)
	}
	s, err := natsjs.EnsureStream(ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".ours.>"}})
	if err != nil {
		t.Fatalf("EnsureStream = %v", err)
	}
	c := s.CachedInfo().Config
	if !pubSameSet(c.Subjects, []string{prefix + ".theirs.>", prefix + ".ours.>"}) || c.Duplicates != natsjs.DefaultDuplicates || c.MaxMsgs != 1000 {
		t.Errorf("config after EnsureStream: subjects %v, duplicates %v, max msgs %d; want both subjects, 10m, the owner's 1000", c.Subjects, c.Duplicates, c.MaxMsgs)
	}
	// Again: nothing to change, no error.
	if _, err := natsjs.EnsureStream(ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{prefix + ".ours.>"}}); err != nil {
		t.Errorf("EnsureStream again = %v", err)
	}
}

func pubSameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range b {
		found := false
		for _, y := range a {
			found = found || x == y
		}
		if !found {
			return false
		}
	}
	return true
}

// A NATS outage: publishes fail (within their deadline, never hang)
// while the server is down and succeed once it is back, with the stream
// recreated if the server lost it; a message published before the outage
// and again after it is stored once.
func TestPublishAcrossRestart(t *testing.T) {
	srv := natstest.Start(t)
	_, js := pubConnect(t, srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	p, err := natsjs.NewPublisher(js, &natsjs.PublisherOptions{Stream: &jetstream.StreamConfig{Name: "RESTART", Subjects: []string{"restart.>"}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	first := outbox.Message{ID: "evt_before", Subject: "restart.a"}
	if err := p.Publish(ctx, first); err != nil {
		t.Fatal(err)
	}
	srv.Kill(t)
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = p.Publish(dctx, outbox.Message{ID: "evt_during", Subject: "restart.a"})
	cancel()
	if err == nil {
		t.Fatal("Publish while NATS is down = nil; want an error")
	}
	srv.Restart(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := p.Publish(pctx, outbox.Message{ID: "evt_during", Subject: "restart.a"})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Publish 30s after the restart = %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := p.Publish(ctx, first); err != nil { // the republish of an unknown outcome
		t.Fatal(err)
	}
	n, ids := pubCount(t, js, "RESTART")
	if n != 2 || ids["evt_before"] != 1 || ids["evt_during"] != 1 {
		t.Errorf("stream holds %d, by id %v; want each id once", n, ids)
	}
}

func TestNewPublisherRefusesNil(t *testing.T) {
	if _, err := natsjs.NewPublisher(nil, nil); err == nil {
		t.Error("NewPublisher(nil) = nil error")
	}
	if _, err := natsjs.NewConnPublisher(nil, nil); err == nil {
		t.Error("NewConnPublisher(nil) = nil error")
	}
}
