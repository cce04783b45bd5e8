package storm

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
)

func (s *stormer) submitToken(ctx context.Context, purpose string) (string, error) {
	a := s.send(ctx, "POST", "/api/v1/submit-tokens", "", fmt.Sprintf(`{"purpose":%q}`, purpose))
	if tok := a.str("token"); a.status == http.StatusCreated && tok != "" {
		return tok, nil
	}
	return "", fmt.Errorf("storm: mint a %s submit token: %s; want 201", purpose, a)
}

// submitTokens mints n tokens, a few at a time.
func (s *stormer) submitTokens(ctx context.Context, label, purpose string, n int) ([]string, error) {
	answers := s.fire(ctx, fmt.Sprintf("%s %d %s tokens", label, n, purpose), n, min(n, 8), func(int) stormAnswer {
		return s.send(ctx, "POST", "/api/v1/submit-tokens", "", fmt.Sprintf(`{"purpose":%q}`, purpose))
	})
	toks := make([]string, n)
	for i, a := range answers {
		if toks[i] = a.str("token"); a.status != http.StatusCreated || toks[i] == "" {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("storm: mint a %s submit token: %s; want 201", purpose, a)
		}
	}
	return toks, nil
}

func (s *stormer) balance(ctx context.Context) (money.Amount, error) {
	a := s.send(ctx, "GET", "/api/v1/account", "", "")
	bal, err := money.Parse(a.str("balance"))
	if a.status != http.StatusOK || err != nil {
		return 0, fmt.Errorf("storm: read the balance: %s; want 200 with a balance", a)
	}
	return bal, nil
}

type stormEntry struct {
	kind   string
	amount money.Amount
}

func (s *stormer) ledger(ctx context.Context) ([]stormEntry, error) {
	a := s.send(ctx, "GET", "/api/v1/ledger", "", "")
	if a.status != http.StatusOK {
		return nil, fmt.Errorf("storm: read the ledger: %s; want 200", a)
	}
	items, _ := a.body["items"].([]any)
	out := make([]stormEntry, 0, len(items))
	for _, it := range items {
		m, _ := it.(map[string]any)
		kind, _ := m["kind"].(string)
		text, _ := m["amount"].(string)
		amt, err := money.Parse(strings.TrimPrefix(text, "-"))
		if err != nil {
			return nil, fmt.Errorf("storm: ledger amount %q: %w", text, err)
		}
		if strings.HasPrefix(text, "-") {
			amt = -amt
		}
		out = append(out, stormEntry{kind, amt})
	}
	return out, nil
}

// send makes one request as the user; a transport error is in the answer.
func (s *stormer) send(ctx context.Context, method, path, key, body string) stormAnswer {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.cfg.Target+path, rd)
	if err != nil {
		return stormAnswer{err: err}
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return stormAnswer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return stormAnswer{err: err}
	}
	a := stormAnswer{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true", retryAfter: resp.Header.Get("Retry-After")}
	_ = json.Unmarshal(raw, &a.body) // a body that is not JSON leaves no code
	a.code = a.str("code")
	return a
}

func stormRandom(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b
}
