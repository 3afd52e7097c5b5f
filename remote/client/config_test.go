package client

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestConfigOutOfRange: a negative duration in a worker's or a reconnecting
// source's config is an error naming the field (internal/defaults), never
// silently replaced by the default; it is found before any connection.
func TestConfigOutOfRange(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"health interval", RunWorker(ctx, nil, WorkerConfig{HealthInterval: -time.Second}), "client.WorkerConfig.HealthInterval = -1s"},
		{"health timeout", RunWorker(ctx, nil, WorkerConfig{HealthTimeout: -time.Second}), "client.WorkerConfig.HealthTimeout = -1s"},
		{"backoff", reconnectErr(Reconnect{Backoff: -time.Millisecond}), "client.Reconnect.Backoff = -1ms"},
		{"max below backoff", reconnectErr(Reconnect{Backoff: time.Second, MaxBackoff: time.Millisecond}), "client.Reconnect.MaxBackoff = 1ms: must be >= Backoff (1s)"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, tc.err, tc.want)
		}
	}
}

func reconnectErr(rc Reconnect) error {
	_, err := streamReconnecting(context.Background(), nil, "app", "s", rc, nil)
	return err
}
