package auth

import (
	"math"
	"sync"
	"time"

	"github.com/mdag/mdag/internal/clock"
)

// Rates configures a Limiter: token buckets of Rate per second holding at
// most Burst, one per client (by key, e.g. IP) and one for everyone.
// A zero Rate turns that bucket off.
type Rates struct {
	PerClient, PerClientBurst float64
	Global, GlobalBurst       float64
}

// Limiter is a per-client and a global token bucket on an injected clock.
// It holds at most maxClients client buckets: when full, those that have
// refilled (indistinguishable from new ones) are dropped; a client that
// still finds no room is held to the global bucket only.
type Limiter struct {
	r          Rates
	clk        clock.Clock
	maxClients int

	mu      sync.Mutex
	global  bucket
	clients map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// DefaultMaxClients is how many client buckets a Limiter keeps.
const DefaultMaxClients = 10_000

// NewLimiter returns a limiter, or nil when both rates are zero (a nil
// *Limiter allows everything).
func NewLimiter(r Rates, clk clock.Clock) *Limiter {
	if r.PerClient <= 0 && r.Global <= 0 {
		return nil
	}
	if clk == nil {
		clk = clock.Real{}
	}
	r.PerClientBurst = max(r.PerClientBurst, 1)
	r.GlobalBurst = max(r.GlobalBurst, 1)
	now := clk.Now()
	return &Limiter{r: r, clk: clk, maxClients: DefaultMaxClients, clients: map[string]*bucket{},
		global: bucket{tokens: r.GlobalBurst, at: now}}
}

// Scopes a refusal names.
const (
	ScopeClient = "client"
	ScopeGlobal = "global"
)

// Allow takes one token from client's bucket and the global one, or, when
// either is empty, takes none and says which (ScopeClient, ScopeGlobal)
// and when a token will be there.
func (l *Limiter) Allow(client string) (ok bool, scope string, retry time.Duration) {
	return l.take(client, true, true, true)
}

// AllowClient takes one token from client's bucket only: the check before
// a request is authenticated, so that unauthenticated clients, however
// many, never spend the global bucket the authenticated ones share
// (AllowGlobal, after authentication).
func (l *Limiter) AllowClient(client string) (ok bool, retry time.Duration) {
	ok, _, retry = l.take(client, true, false, true)
	return ok, retry
}

// AllowGlobal takes one token from the global bucket only.
func (l *Limiter) AllowGlobal() (ok bool, retry time.Duration) {
	ok, _, retry = l.take("", false, true, true)
	return ok, retry
}

// Peek says whether client's bucket has a token, taking none.
func (l *Limiter) Peek(client string) (ok bool, retry time.Duration) {
	ok, _, retry = l.take(client, true, false, false)
	return ok, retry
}

func (l *Limiter) take(client string, perClient, global, spend bool) (ok bool, scope string, retry time.Duration) {
	if l == nil {
		return true, "", 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	var cb *bucket
	if perClient && l.r.PerClient > 0 {
		cb = l.clientLocked(client, now)
		if cb != nil {
			cb.refill(now, l.r.PerClient, l.r.PerClientBurst)
			if cb.tokens < 1 {
				return false, ScopeClient, wait(cb.tokens, l.r.PerClient)
			}
		}
	}
	if global && l.r.Global > 0 {
		l.global.refill(now, l.r.Global, l.r.GlobalBurst)
		if l.global.tokens < 1 {
			return false, ScopeGlobal, wait(l.global.tokens, l.r.Global)
		}
		if spend {
			l.global.tokens--
		}
	}
	if cb != nil && spend {
		cb.tokens--
	}
	return true, "", 0
}

// clientLocked is client's bucket, made full when new; nil when there is
// no room for another.
func (l *Limiter) clientLocked(client string, now time.Time) *bucket {
	if b := l.clients[client]; b != nil {
		return b
	}
	if len(l.clients) >= l.maxClients {
		for k, b := range l.clients {
			b.refill(now, l.r.PerClient, l.r.PerClientBurst)
			if b.tokens >= l.r.PerClientBurst {
				delete(l.clients, k)
			}
		}
		if len(l.clients) >= l.maxClients {
			return nil
		}
	}
	b := &bucket{tokens: l.r.PerClientBurst, at: now}
	l.clients[client] = b
	return b
}

// Clients is the number of client buckets held.
func (l *Limiter) Clients() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.clients)
}

func (b *bucket) refill(now time.Time, rate, burst float64) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens = math.Min(burst, b.tokens+d.Seconds()*rate)
	}
	b.at = now
}

// wait is how long until a bucket with tokens has one, rounded up to a
// whole second (Retry-After is in seconds), at least 1 s.
func wait(tokens, rate float64) time.Duration {
	return time.Duration(max(1, math.Ceil((1-tokens)/rate))) * time.Second
}
