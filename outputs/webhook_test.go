package outputs_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/outputs"
	"github.com/mdag/mdag/outputs/spool"
	"github.com/mdag/mdag/outputs/webhook"
)

// TestWebhookRetries: a receiver that checks each request's signature
// answers 500 twice, then lets one request time out, then 429 with
// Retry-After, then 200s: the hub sends again after each (the same
// Idempotency-Key each time) and every event arrives once acknowledged,
// in order.
func TestWebhookRetries(t *testing.T) {
	secret := []byte("hook-key")
	var mu sync.Mutex
	var attempts, keys []string
	var seqs []uint64
	release := make(chan struct{})
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(secret, r.Header.Get("X-Mdag-Signature"), body, time.Now(), 5*time.Minute); err != nil {
			t.Errorf("signature: %v", err)
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		mu.Lock()
		n++
		call := n
		attempts = append(attempts, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		switch call {
		case 1, 2:
			http.Error(w, "busy", http.StatusInternalServerError)
			return
		case 3:
			<-release // the client's timeout ends it
			return
		case 4:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		var b outputs.Body
		if err := json.Unmarshal(body, &b); err != nil {
			t.Errorf("body: %v", err)
		}
		mu.Lock()
		keys, seqs = append(keys, b.ID), append(seqs, b.Seq)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	defer close(release)
	tr, err := webhook.New(webhook.Config{URL: srv.URL, Secret: secret, Timeout: 2 * time.Second}) // long enough for a 200 on a loaded machine
	if err != nil {
		t.Fatal(err)
	}
	sp, err := spool.Open(spool.Options{Dir: t.TempDir(), MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	h, err := outputs.Start(outputs.Config{App: "lot", Clock: clock.Real{}, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		Outputs: []outputs.Output{{Name: "hook", Kinds: []string{outputs.KindEvent}, Transport: tr, Spool: sp}}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for i := range 5 {
		h.Add(outputs.Result{Stream: "gate", Seq: uint64(i), Outcome: "finished", Finished: time.Now(), Events: []media.Event{{Kind: "line-cross", Rule: "gate"}}})
	}
	waitFor(t, "5 events acknowledged", func() bool { return h.Status()[0].Published == 5 })
	mu.Lock()
	defer mu.Unlock()
	for i, s := range seqs {
		if s != uint64(i) {
			t.Fatalf("acknowledged in order %v, want 0..4", seqs)
		}
	}
	for i := 1; i < 5; i++ {
		if attempts[i] != attempts[0] {
			t.Errorf("attempt %d of the first event had key %s, the first %s: a retry keeps its key", i+1, attempts[i], attempts[0])
		}
	}
	if keys[0] != attempts[0] {
		t.Errorf("the first event was acknowledged with key %s, tried with %s", keys[0], attempts[0])
	}
	if st := h.Status()[0]; st.Retried != 4 || st.Dropped() != 0 || !st.Connected {
		t.Errorf("status %+v: want 4 retries (500, 500, timeout, 429), nothing lost", st)
	}
}
