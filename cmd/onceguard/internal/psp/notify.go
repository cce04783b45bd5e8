package psp

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/onceguard/onceguard/webhook"
)

// Event is a callback's body: an operation that settled.
type Event struct {
	ID        string    `json:"id"`   // evt_...: the same on every redelivery
	Type      string    `json:"type"` // operation.succeeded or operation.failed
	CreatedAt time.Time `json:"created_at"`
	Operation Operation `json:"operation"`
}

// The event types.
const (
	EventSucceeded = "operation.succeeded"
	EventFailed    = "operation.failed"
)

func newEvent(op Operation) Event {
	var b [12]byte
	_, _ = crand.Read(b[:])
	typ := EventSucceeded
	if op.Status == Failed {
		typ = EventFailed
	}
	return Event{ID: "evt_" + hex.EncodeToString(b[:]), Type: typ, CreatedAt: time.Now().UTC(), Operation: op}
}

// Notifier delivers callbacks: a POST of the event to URL, signed with
// Secret in the header Onceguard-Signature (webhook.Onceguard), retried
// with exponential backoff until a 2xx answer or Attempts deliveries. A
// Notifier is safe for concurrent use; set its fields before use.
type Notifier struct {
	URL    string
	Secret []byte
	// Client sends the callbacks. nil means a client of its own with a 5s timeout.
	Client *http.Client
	// MinBackoff is the wait before the first redelivery, doubled for each
	// next one up to MaxBackoff. 0 means 100ms and 30s.
	MinBackoff, MaxBackoff time.Duration
	// Attempts bounds the deliveries of one event. 0 means 30: with the
	// default backoff, the first 11 span more than a minute, and all about 11 minutes.
	Attempts int
	// Delay is how long notify_delay holds a callback back. 0 means 2s.
	Delay time.Duration
	// Hold, if set, holds notify_delay's callback back instead of Delay:
	// it is delivered once Hold returns true, never if false (a test
	// releases it when the callback that is to overtake it has arrived).
	Hold func(ctx context.Context) bool
	// Now is the clock the signatures carry. nil means time.Now.
	Now func() time.Time

	once sync.Once
	hc   *http.Client
}

func (n *Notifier) client() *http.Client {
	n.once.Do(func() {
		n.hc = n.Client
		if n.hc == nil {
			n.hc = &http.Client{Timeout: 5 * time.Second, Transport: http.DefaultTransport.(*http.Transport).Clone()}
		}
	})
	return n.hc
}

// Backoff is the wait before redelivery number attempt (1 for the first),
// without its jitter (up to a tenth more).
func (n *Notifier) Backoff(attempt int) time.Duration {
	lo, hi := n.MinBackoff, n.MaxBackoff
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi <= 0 {
		hi = 30 * time.Second
	}
	d := lo
	for i := 1; i < attempt && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

// deliver sends ev as fault says, redelivering until a 2xx, Attempts or ctx's end.
func (n *Notifier) deliver(ctx context.Context, ev Event, fault Fault) {
	body, err := json.Marshal(ev)
	if err != nil {
		return
	}
	switch fault {
	case NotifyDrop:
		return
	case NotifyDelay:
		if n.Hold != nil {
			if !n.Hold(ctx) {
				return
			}
			break
		}
		d := n.Delay
		if d <= 0 {
			d = 2 * time.Second
		}
		if !sleep(ctx, d) {
			return
		}
	case NotifyDuplicate: // 5 deliveries at once, each redelivered on its own
		var wg sync.WaitGroup
		for range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n.redeliver(ctx, body, false)
			}()
		}
		wg.Wait()
		return
	}
	n.redeliver(ctx, body, fault == NotifyBadSignature)
}

func (n *Notifier) redeliver(ctx context.Context, body []byte, badFirst bool) {
	attempts := n.Attempts
	if attempts <= 0 {
		attempts = 30
	}
	for i := range attempts {
		if i > 0 {
			d := n.Backoff(i)
			if !sleep(ctx, d+rand.N(d/10+1)) {
				return
			}
		}
		if n.post(ctx, body, badFirst && i == 0) {
			return
		}
	}
}

// post delivers body once and reports whether it was answered 2xx.
func (n *Notifier) post(ctx context.Context, body []byte, badSignature bool) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.URL, bytes.NewReader(body))
	if err != nil {
		return false
	}
	now := time.Now
	if n.Now != nil {
		now = n.Now
	}
	secret := n.Secret
	if badSignature {
		secret = append([]byte("not "), secret...)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.OnceguardHeader, webhook.Onceguard{}.Sign(secret, now(), body))
	resp, err := n.client().Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}
