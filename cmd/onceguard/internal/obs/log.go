package obs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/app"
)

// NewLogger returns the service's logger on w: JSON, or text when format
// is "text" or "auto" and w is a terminal; at level (debug, info, warn,
// error).
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "auto", "":
		if isTerminal(w) {
			return slog.New(slog.NewTextHandler(w, opts)), nil
		}
	default:
		return nil, fmt.Errorf("--log-format %q: want auto, json or text", format)
	}
	return slog.New(slog.NewJSONHandler(w, opts)), nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Hash is how secrets appear in logs: the first 12 hex digits of their
// SHA-256, enough to match lines of one key or token, useless to replay
// it. "" stays "".
func Hash(secret string) string { return app.Hash(secret) }

// RequestID returns the request's X-Request-Id when it is a safe token
// (1 to 64 of letters, digits, '-', '_', '.'), else a new random one.
func RequestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 64 && strings.Trim(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == "" {
		return id
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// WithLogger returns ctx carrying l (app.WithLogger: the domain's lines use it too).
func WithLogger(ctx context.Context, l *slog.Logger) context.Context { return app.WithLogger(ctx, l) }

// Logger returns the logger ctx carries (with its request id), or def.
func Logger(ctx context.Context, def *slog.Logger) *slog.Logger { return app.Logger(ctx, def) }
