// Package app is the reference service's domain: its types, rules and
// errors, the ports it needs (Store, Provider), and Service, the operations
// the HTTP layer and the reconciler call.
package app

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/money"
	"github.com/onceguard/onceguard/lock"
)

// MaxBalance bounds an account's balance, far below where int64 minor units overflow;
// MaxAmountLimit bounds Config.MaxAmount, so deposits racing past the balance check would have to be thousands.
const (
	MaxBalance     = money.Amount(math.MaxInt64 / 2)
	MaxAmountLimit = money.Amount(1_000_000_000_000_000) // 10 000 000 000 000.00
)

// Config wires a Service.
type Config struct {
	Store    Store
	Provider Provider
	Currency string
	// MaxAmount is the largest amount one request may move.
	MaxAmount money.Amount
	// Locks holds the per-user and per-order locks, renewed while held; Withdraw and Pay need it.
	Locks *lock.Locker
	// LockTTL is how long a crashed holder blocks the account or order (0: 10s).
	LockTTL time.Duration
	// LockBackend names the lock backend serving now, for log lines (nil: not named).
	LockBackend func() string
	// KeyLease is how long an in-flight Idempotency-Key is protected (0: 30s).
	KeyLease time.Duration
	// RequestTimeout is a keyed request's deadline; a settlement after the provider's answer
	// gets a quarter of it more, so the request ends inside its key's lease.
	// 0, or more than the lease allows: 3/5 of KeyLease.
	RequestTimeout time.Duration
	// SessionTTL is how long a sign-in lasts (0: 24h).
	SessionTTL time.Duration
	// Logger writes the audit and lock lines; a request's logger in ctx (WithLogger) wins (nil: none).
	Logger *slog.Logger
	// Metrics counts the audit lines of requests (nil: none).
	Metrics interface{ CountMoney(kind, outcome string) }
	// NotifyMetrics counts the provider callbacks Notify answered (nil: none).
	NotifyMetrics NotifyMetrics
}

// DefaultRequestTimeout is a keyed request's deadline under a key lease of lease: 3/5 of it.
func DefaultRequestTimeout(lease time.Duration) time.Duration { return lease * 3 / 5 }

// FitsLease reports whether a keyed request's deadline rt, with a quarter of it more to record
// its settlement, ends inside its key's lease, so that a retry never runs it a second time.
func FitsLease(rt, lease time.Duration) bool { return rt > 0 && rt+rt/4 < lease }

// Service runs the operations; it is safe for concurrent use.
type Service struct {
	cfg       Config
	log       *slog.Logger
	hashSlots chan struct{} // password hashes running (see hashing)
	sessions  sessionCache  // session token hash -> user (SessionPrincipal)

	pendingMu    sync.Mutex
	pendingAfter map[Kind]PendingCursor // where the reconciler's next pass reads on, by kind
}

// New returns a Service on cfg, its zero fields set to their defaults.
func New(cfg Config) *Service {
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = 10 * time.Second
	}
	if cfg.KeyLease <= 0 {
		cfg.KeyLease = 30 * time.Second
	}
	if !FitsLease(cfg.RequestTimeout, cfg.KeyLease) {
		cfg.RequestTimeout = DefaultRequestTimeout(cfg.KeyLease)
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 24 * time.Hour
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, log: log, hashSlots: make(chan struct{}, max(2, runtime.GOMAXPROCS(0)))}
}

// KeyLease is how long an in-flight Idempotency-Key is protected.
func (s *Service) KeyLease() time.Duration { return s.cfg.KeyLease }

// RequestTimeout is a keyed request's deadline.
func (s *Service) RequestTimeout() time.Duration { return s.cfg.RequestTimeout }

// newID returns prefix and 28 hex digits: the time in milliseconds (6
// bytes), then 8 random bytes. Ids made one after another sort in that
// order, so a row inserted goes to the end of every index on its id (the
// primary key, the ledger's UNIQUE (kind, ref)) rather than to a random
// page of it: on SQLite each random page is one more 4 KiB frame in the
// WAL at every commit (bench/README.md, "Movement ids in time order").
// The random half keeps ids unguessable and unique within a millisecond.
// At most 4 bytes of prefix fit the schema's VARCHAR(32).
func newID(prefix string) string {
	var b [14]byte
	binary.BigEndian.PutUint64(b[:8], uint64(time.Now().UnixMilli())<<16)
	_, _ = rand.Read(b[6:])
	return prefix + hex.EncodeToString(b[:])
}

type loggerKey struct{}

// WithLogger returns ctx carrying l, the logger of the request it serves.
func WithLogger(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, loggerKey{}, l)
}

// Logger returns the logger ctx carries, or def.
func Logger(ctx context.Context, def *slog.Logger) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
		return l
	}
	return def
}

// Hash is a secret (a key, a token) as logged: 12 hex digits of its SHA-256, "" for "".
func Hash(secret string) string {
	if secret == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:6])
}

func (s *Service) logger(ctx context.Context) *slog.Logger { return Logger(ctx, s.log) }

// audit writes the one line per money request (who, what, amount, key hash, outcome);
// by names who settled it when not the request.
func (s *Service) audit(ctx context.Context, kind, id, userID, key string, amount money.Amount, outcome Outcome, by string) {
	if by == "" && s.cfg.Metrics != nil {
		s.cfg.Metrics.CountMoney(kind, string(outcome))
	}
	l := s.logger(ctx)
	if !l.Enabled(ctx, slog.LevelInfo) {
		return
	}
	// Typed attributes, on the stack: a line on every money request, without boxing.
	var buf [10]slog.Attr
	attrs := append(buf[:0], slog.Bool("audit", true), slog.String("kind", kind), slog.String("id", id), slog.String("user_id", userID),
		slog.String("amount", amount.String()), slog.String("currency", s.cfg.Currency), slog.String("key_hash", Hash(key)),
		slog.String("outcome", string(outcome)))
	if by != "" {
		attrs = append(attrs, slog.String("by", by))
	}
	l.LogAttrs(ctx, slog.LevelInfo, "money", attrs...)
}
