package client

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestConfigOutOfRange: a negative duration in a worker's config is an error naming the field (internal/defaults), never
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
		{"store bytes", RunWorker(ctx, nil, WorkerConfig{Data: &DataPlane{Store: &Store{MaxBytes: -1}}}), "client.WorkerConfig.Data.Store.MaxBytes = -1: must be >= 0"},
		{"store hold", RunWorker(ctx, nil, WorkerConfig{Data: &DataPlane{Store: &Store{HoldAfter: -time.Second}}}), "client.WorkerConfig.Data.Store.HoldAfter = -1s"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, tc.err, tc.want)
		}
	}
}
