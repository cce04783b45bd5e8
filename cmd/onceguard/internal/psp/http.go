package psp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

// Handler serves sim over HTTP, for `onceguard psp` and for tests:
//
//	POST /v1/operations        Idempotency-Key: K  {"kind":"payout","amount":"10.00"} -> 200 Operation
//	GET  /v1/operations/{key}                                                       -> 200 Operation | 404
//	POST /v1/faults            {"faults":["timeout_after_commit", "notify_drop", ...]} -> 204
//
// An injected timeout keeps the request hanging until the client gives
// up, as a real timeout looks to the client.
func Handler(sim *Sim) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/operations", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Kind   Kind         `json:"kind"`
			Amount money.Amount `json:"amount"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
			http.Error(w, "bad request body", http.StatusBadRequest)
			return
		}
		op, err := sim.Do(r.Context(), req.Kind, r.Header.Get("Idempotency-Key"), req.Amount)
		switch {
		case errors.Is(err, ErrUnknownOutcome):
			// Hang until the client gives up, as a provider that timed out
			// does. (Closing the connection instead would let Go's
			// transport retry the request, since it carries an
			// Idempotency-Key, and hide the timeout.)
			t := time.NewTimer(time.Minute)
			defer t.Stop()
			select {
			case <-r.Context().Done():
			case <-t.C:
				http.Error(w, "timeout", http.StatusGatewayTimeout)
			}
		case errors.Is(err, ErrKeyReused):
			http.Error(w, err.Error(), http.StatusConflict)
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadRequest)
		default:
			writeJSON(w, op)
		}
	})
	mux.HandleFunc("GET /v1/operations/{key}", func(w http.ResponseWriter, r *http.Request) {
		op, err := sim.Lookup(r.Context(), r.PathValue("key"))
		if errors.Is(err, ErrNotFound) {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		} else if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		writeJSON(w, op)
	})
	mux.HandleFunc("POST /v1/faults", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Faults []Fault `json:"faults"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
			http.Error(w, "bad request body", http.StatusBadRequest)
			return
		}
		for _, f := range req.Faults {
			if !f.Known() {
				http.Error(w, fmt.Sprintf("unknown fault %q", f), http.StatusBadRequest)
				return
			}
		}
		sim.Inject(req.Faults...)
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// Client is a Provider over HTTP (a provider served by Handler). Transport
// errors, timeouts, 5xx answers and 200s that are not one readable
// operation for the key asked are ErrUnknownOutcome.
type Client struct {
	base string
	hc   *http.Client
}

var _ Provider = (*Client)(nil)

// NewClient returns a Client for the provider at baseURL. hc nil means a
// client of its own with a 10s timeout, whose connections Close closes.
func NewClient(baseURL string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second, Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), hc: hc}
}

// Close closes the client's idle connections to the provider, those
// its transport dialed for a request another connection then served
// too: left open, the provider sees a connection that never sent a
// request, which its graceful shutdown waits on (net/http's, 5s).
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Do implements Provider.
func (c *Client) Do(ctx context.Context, kind Kind, key string, amount money.Amount) (Operation, error) {
	body, _ := json.Marshal(map[string]any{"kind": kind, "amount": amount})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/operations", bytes.NewReader(body))
	if err != nil {
		return Operation{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return c.send(req, Operation{Key: key, Kind: kind, Amount: amount})
}

// Lookup implements Provider.
func (c *Client) Lookup(ctx context.Context, key string) (Operation, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/operations/"+url.PathEscape(key), nil)
	if err != nil {
		return Operation{}, err
	}
	return c.send(req, Operation{Key: key})
}

// maxAnswer bounds an operation's JSON; a longer answer is not one.
const maxAnswer = 64 << 10

// send sends req and reads the answer. A 200 must be exactly one
// operation for want's key (and kind and amount, when set) with a known
// status (pending too: it settles later): anything else (an empty object, another key, a status we do not
// know, trailing data) is an answer nobody can act on, ErrUnknownOutcome,
// so the movement stays pending and is asked about again rather than
// settled on it (a garbled 200 once settled a payout as failed).
func (c *Client) send(req *http.Request, want Operation) (Operation, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return Operation{}, fmt.Errorf("%w: %w", ErrUnknownOutcome, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
		op, err := decodeOperation(resp.Body, want)
		if err != nil {
			return Operation{}, fmt.Errorf("%w: malformed answer: %w", ErrUnknownOutcome, err)
		}
		return op, nil
	case resp.StatusCode == http.StatusNotFound:
		return Operation{}, ErrNotFound
	case resp.StatusCode == http.StatusConflict:
		return Operation{}, ErrKeyReused
	case resp.StatusCode < 500:
		return Operation{}, fmt.Errorf("%w: HTTP %d", ErrInvalid, resp.StatusCode)
	}
	return Operation{}, fmt.Errorf("%w: HTTP %d", ErrUnknownOutcome, resp.StatusCode)
}

// decodeOperation reads one operation from r and checks it answers want.
func decodeOperation(r io.Reader, want Operation) (Operation, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxAnswer+1))
	if err != nil {
		return Operation{}, err
	}
	if len(b) > maxAnswer {
		return Operation{}, fmt.Errorf("longer than %d bytes", maxAnswer)
	}
	if b = bytes.TrimLeft(b, " \t\r\n"); len(b) == 0 || b[0] != '{' {
		return Operation{}, errors.New("not a JSON object")
	}
	var op Operation
	if err := json.Unmarshal(b, &op); err != nil { // trailing data is an error too
		return Operation{}, err
	}
	switch {
	case op.ID == "":
		return Operation{}, errors.New("no operation id")
	case op.Key != want.Key:
		return Operation{}, fmt.Errorf("operation for key %q, asked about %q", op.Key, want.Key)
	case op.Status != Succeeded && op.Status != Failed && op.Status != Pending:
		return Operation{}, fmt.Errorf("unknown status %q", op.Status)
	case op.Kind != Charge && op.Kind != Payout, want.Kind != "" && op.Kind != want.Kind:
		return Operation{}, fmt.Errorf("kind %q", op.Kind)
	case op.Amount <= 0, want.Amount != 0 && op.Amount != want.Amount:
		return Operation{}, fmt.Errorf("amount %s", op.Amount)
	}
	return op, nil
}
