package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onceguard/onceguard/cmd/onceguard/internal/httpapi"
	"github.com/onceguard/onceguard/idempotency/idemstore"
	"github.com/onceguard/onceguard/lock"
	"github.com/onceguard/onceguard/lock/fallback"
	"github.com/onceguard/onceguard/lock/memlock"
	"github.com/onceguard/onceguard/lock/redislock"
	"github.com/onceguard/onceguard/lock/redlock"
	"github.com/onceguard/onceguard/lock/sqllock"
	"github.com/onceguard/onceguard/sqldialect"
)

// coordination is where the service's locks and repeat-submit window live
// (docs/api.md, "Where state lives"):
//
//   - no --redis: locks in the database (PostgreSQL, MySQL: shared by every
//     instance) or in process (SQLite, one process), the window in the
//     database;
//   - --redis: locks in Redis (one node, or a quorum of independent
//     nodes), falling back to the database at once when Redis does not
//     answer and returning to it when it does; the window in the database
//     still, so that it survives Redis losing its data or its first node.
type coordination struct {
	locks    *lock.Locker
	windows  idemstore.WindowStore
	breaker  *fallback.Backend // nil without --redis
	clients  []*redis.Client
	describe string

	secondaryName string // "database" or "memory"
}

// backend names the lock backend serving now, for metric labels.
func (c *coordination) backend() string {
	switch {
	case c == nil:
		return "unknown"
	case c.breaker != nil && !c.breaker.Degraded():
		return "redis"
	default:
		return c.secondaryName
	}
}

// Redis client settings for a service that must notice a dead or
// black-holed Redis within a fraction of a second and fall back, rather
// than hold requests for go-redis's default 3 s times 3 retries.
const redisTimeout = 500 * time.Millisecond

// newCoordination builds it; dbWindows is the database's window store;
// timeDB, if not nil, wraps the database lock backend (to time its calls).
// Leases are renewed automatically (lopts.AutoRenew is set), so the TTL
// only bounds how long a crashed holder blocks others.
func newCoordination(db *sql.DB, dialect sqldialect.Dialect, redisURLs string, dbWindows idemstore.WindowStore, timeDB func(lock.Backend) lock.Backend, lopts lock.Options, fopts *fallback.Options) (*coordination, error) {
	lopts.AutoRenew = true
	c := &coordination{windows: dbWindows, secondaryName: "memory"}
	var secondary lock.Backend
	where := "in process"
	switch dialect {
	case sqldialect.Postgres, sqldialect.MySQL:
		b, err := sqllock.New(db, dialect, nil)
		if err != nil {
			return nil, err
		}
		secondary, where, c.secondaryName = b, "the database", "database"
		if timeDB != nil {
			secondary = timeDB(b)
		}
	default:
		secondary = &memlock.Backend{}
	}
	var urls []string
	for _, u := range strings.Split(redisURLs, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	if len(urls) == 0 {
		c.locks = lock.New(secondary, &lopts)
		c.describe = "locks " + where + ", repeat window in the database"
		return c, nil
	}
	for _, u := range urls {
		opt, err := redis.ParseURL(u)
		if err != nil {
			c.close()
			return nil, fmt.Errorf("--redis %q: %w", redactURL(u), err)
		}
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = redisTimeout, redisTimeout, redisTimeout
		opt.PoolTimeout = 2 * redisTimeout
		opt.MaxRetries = -1 // a retry would double the time to fall back; the breaker retries later
		c.clients = append(c.clients, redis.NewClient(opt))
	}
	ropts := &redislock.Options{ClockFences: true, Timeout: redisTimeout}
	var primary lock.Backend
	what := "Redis"
	if len(c.clients) == 1 {
		primary = redislock.New(c.clients[0], ropts)
	} else {
		clients := make([]redis.UniversalClient, len(c.clients))
		for i, cl := range c.clients {
			clients[i] = cl
		}
		b, err := redlock.New(clients, &redlock.Options{NodeTimeout: redisTimeout, Redis: ropts})
		if err != nil {
			c.close()
			return nil, err
		}
		primary = b
		what = fmt.Sprintf("a quorum of %d Redis nodes", len(c.clients))
	}
	c.breaker = fallback.New(primary, secondary, fopts)
	// The window stays in the database (c.windows as above): an entry only
	// in Redis is forgotten when Redis restarts empty, is not seen by an
	// instance that fell back, and waits out a black-holed first node on
	// every request.
	c.locks = lock.New(c.breaker, &lopts)
	c.describe = fmt.Sprintf("locks in %s, falling back to %s; repeat window in the database", what, where)
	return c, nil
}

// redisStatus pings every node: "ok", "unreachable" when any does not
// answer, or "not configured" without --redis (healthy: nothing to
// reach).
func (c *coordination) redisStatus(ctx context.Context) (string, bool) {
	if len(c.clients) == 0 {
		return "not configured", true
	}
	// All nodes at once: a dead one costs redisTimeout once, not per node.
	answered := make([]bool, len(c.clients))
	var wg sync.WaitGroup
	for i, cl := range c.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, redisTimeout)
			defer cancel()
			answered[i] = cl.Ping(pctx).Err() == nil
		}()
	}
	wg.Wait()
	n := 0
	for _, ok := range answered {
		if ok {
			n++
		}
	}
	switch {
	case n == len(c.clients):
		return "ok", true
	case len(c.clients) == 1 || n == 0:
		return "unreachable", false
	case n > len(c.clients)/2:
		// The locks still hold on a majority; one node more lost and
		// they fall back: degraded.
		return fmt.Sprintf("%d of %d nodes answer (a quorum: locks stay on Redis)", n, len(c.clients)), false
	}
	return fmt.Sprintf("%d of %d nodes answer (no quorum)", n, len(c.clients)), false
}

// locksStatus names the lock backend serving now and the fallback state:
// "memory" or "database" without --redis; "redis" while the breaker is
// closed; "database (fallback: Redis does not answer, breaker open)" (or
// "memory (...)" on SQLite) after it fell back, which is degraded. It
// probes Redis (fallback.Backend.Probe) when the breaker may try it again.
func (c *coordination) locksStatus(ctx context.Context) (string, bool) {
	if c.breaker == nil {
		return c.secondaryName, true
	}
	// Without lock traffic nothing else would try Redis again: the check
	// itself probes it once the breaker's cooldown has passed.
	if c.breaker.Probe(ctx) != fallback.Closed {
		return c.secondaryName + " (fallback: Redis does not answer, breaker " + c.breaker.State().String() + ")", false
	}
	return "redis", true
}

// components are the parts /readyz reports besides the database and the
// provider, always: Redis (each node's reachability, or not configured)
// and the locks (the backend serving and the fallback state).
func (c *coordination) components() []httpapi.Component {
	return []httpapi.Component{{Name: "redis", Check: c.redisStatus}, {Name: "locks", Check: c.locksStatus}}
}

func (c *coordination) close() {
	for _, cl := range c.clients {
		_ = cl.Close()
	}
}
