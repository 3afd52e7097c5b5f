package auth

import (
	"log/slog"
	"sync"
	"time"

	"github.com/mdag/mdag/internal/clock"
)

// LogLimiter logs refusals a client can cause as often as it likes (a bad
// token, a flood of offers) at most once per Every and reason, with the
// number left out since the previous line (not_logged_since_last).
type LogLimiter struct {
	Clock clock.Clock
	Log   *slog.Logger
	Every time.Duration

	mu   sync.Mutex
	last map[string]time.Time
	left map[string]int
}

// Warn logs msg at warning level unless reason was logged less than Every
// ago; then it only counts it.
func (l *LogLimiter) Warn(reason, msg string, args ...any) {
	l.mu.Lock()
	now := l.Clock.Now()
	if l.last == nil {
		l.last, l.left = map[string]time.Time{}, map[string]int{}
	}
	if at, ok := l.last[reason]; ok && now.Sub(at) < l.Every {
		l.left[reason]++
		l.mu.Unlock()
		return
	}
	left := l.left[reason]
	l.last[reason], l.left[reason] = now, 0
	l.mu.Unlock()
	l.Log.Warn(msg, append(args, "reason", reason, "not_logged_since_last", left)...)
}
