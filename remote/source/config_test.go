package source

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestReconnectOutOfRange: a negative backoff, or a maximum below it, is
// an error naming the field (internal/defaults), never silently replaced;
// it is found before any connection.
func TestReconnectOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		rc   Reconnect
		want string
	}{
		{Reconnect{Backoff: -time.Millisecond}, "source.Reconnect.Backoff = -1ms"},
		{Reconnect{Backoff: time.Second, MaxBackoff: time.Millisecond}, "source.Reconnect.MaxBackoff = 1ms: must be >= Backoff (1s)"},
	} {
		_, err := streamReconnecting(context.Background(), nil, "app", "s", tc.rc, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error with %q", tc.rc, err, tc.want)
		}
	}
}
