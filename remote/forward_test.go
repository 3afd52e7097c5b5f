package remote

import (
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote/client"
)

// TestForwarder: streams ingested on a source machine reach the
// coordinator through a Forwarder: a joined stream's frames are accepted
// (the engine counts them) and Leave ends its session; a join the
// coordinator refuses (unknown app) surfaces as the stream's Ingest error
// with the coordinator's reason; Close leaves what is still joined.
func TestForwarder(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startCoordinator(t, app, prof, time.Second)
	f := client.NewForwarder(c.cc)
	if err := f.Join("traffic", "door"); err != nil {
		t.Fatal(err)
	}
	if err := f.Join("traffic", "door"); err == nil || !strings.Contains(err.Error(), "already joined") {
		t.Fatalf("a second join of door: %v", err)
	}
	frame := media.NewFrame(32, 24)
	for seq := range uint64(5) {
		if err := f.Ingest("door", seq, time.Now(), frame, nil); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the engine to take door's frames", 10*time.Second, func() bool {
		for _, s := range c.e.Status().Sessions {
			if s.App == "traffic" && s.Total.Sent >= 5 {
				return true
			}
		}
		return false
	})
	if err := f.Leave("door"); err != nil {
		t.Fatal(err)
	}
	if err := f.Ingest("door", 6, time.Now(), frame, nil); err == nil || !strings.Contains(err.Error(), "not joined") {
		t.Fatalf("ingest after leave: %v", err)
	}

	if err := f.Join("nope", "gate"); err != nil {
		t.Fatalf("join is asynchronous: %v", err)
	}
	var err error
	waitFor(t, "the refused join to surface", 10*time.Second, func() bool {
		err = f.Ingest("gate", 0, time.Now(), frame, nil)
		return err != nil
	})
	if !strings.Contains(err.Error(), "ingest gate") || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("refused join: %v", err)
	}
	if err := f.Join("traffic", "yard"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err == nil || !strings.Contains(err.Error(), "ingest gate") {
		t.Fatalf("Close: %v, want gate's error", err)
	}
	if err := f.Join("traffic", "late"); err == nil {
		t.Fatal("a join after Close")
	}
}
