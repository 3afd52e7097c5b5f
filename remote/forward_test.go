package remote

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote/client"
	"github.com/mdag/mdag/remote/source"
)

// TestForwarder: streams ingested on a source machine reach the
// coordinator through a Forwarder: a joined stream's frames are accepted
// (the engine counts them) and Leave ends its session; a join the
// coordinator refuses (unknown app) surfaces as the stream's Ingest error
// with the coordinator's reason; Close leaves what is still joined.
func TestForwarder(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startCoordinator(t, app, prof, time.Second)
	f := source.NewForwarder(c.cc)
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

// TestForwarderJoinDoesNotBlockOthers: a Join whose call waits for the
// connection to the coordinator (a listener that accepts and never
// speaks HTTP/2: connecting until gRPC's 20 s connect timeout) holds no
// lock the other streams need: Ingest and Leave of another stream and a
// second Join of the same name answer at once; Close cancels the Join in
// flight, which returns.
func TestForwarderJoinDoesNotBlockOthers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, silent
		}
	}()
	cc, err := client.Dial(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	f := source.NewForwarder(cc)
	joined := make(chan error, 1)
	go func() { joined <- f.Join("traffic", "door") }()
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the join did not dial the coordinator")
	}
	// Each answers at once with the fix; before it, each waited for the
	// join (20 s). 10 s is a bound for a loaded machine.
	frame := media.NewFrame(32, 24)
	for _, c := range []struct {
		name string
		call func() error
		want string
	}{
		{"ingest of another stream", func() error { return f.Ingest("yard", 0, time.Now(), frame, nil) }, "ingest yard: not joined"},
		{"leave of another stream", func() error { return f.Leave("yard") }, "ingest yard: not joined"},
		{"join of the same name", func() error { return f.Join("traffic", "door") }, "ingest door: already joined"},
		{"ingest of the joining stream", func() error { return f.Ingest("door", 0, time.Now(), frame, nil) }, "ingest door: still joining"},
	} {
		done := make(chan error, 1)
		go func() { done <- c.call() }()
		select {
		case err := <-done:
			if err == nil || err.Error() != c.want {
				t.Fatalf("%s: %v, want %q", c.name, err, c.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: blocked behind the join in flight", c.name)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-joined:
		if err == nil || !strings.Contains(err.Error(), "ingest door: left while joining") {
			t.Fatalf("the join cancelled by Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not cancel the join in flight")
	}
}

// TestForwarderRejoinAfterFailedStream: a stream whose call failed (the
// coordinator refused it) fails every Ingest with that reason until it
// leaves; joined again (the camera's new feed after the server ended the
// stream) it is a new call, whose frames the coordinator accepts.
func TestForwarderRejoinAfterFailedStream(t *testing.T) {
	app, prof := loadExample(t, "traffic")
	c := startCoordinator(t, app, prof, time.Second)
	f := source.NewForwarder(c.cc)
	defer f.Close()
	frame := media.NewFrame(32, 24)
	if err := f.Join("nope", "gate"); err != nil {
		t.Fatal(err)
	}
	var first error
	waitFor(t, "the refused join to surface", 10*time.Second, func() bool {
		first = f.Ingest("gate", 0, time.Now(), frame, nil)
		return first != nil
	})
	if err := f.Ingest("gate", 1, time.Now(), frame, nil); err == nil || err.Error() != first.Error() {
		t.Fatalf("the next ingest: %v, want the call's error %v", err, first)
	}
	if err := f.Join("traffic", "gate"); err == nil || !strings.Contains(err.Error(), "already joined") {
		t.Fatalf("a join before the failed stream left: %v", err)
	}
	if err := f.Leave("gate"); err == nil || err.Error() != first.Error() {
		t.Fatalf("Leave of the failed stream: %v, want %v", err, first)
	}
	if err := f.Join("traffic", "gate"); err != nil {
		t.Fatalf("join after the failed stream left: %v", err)
	}
	for seq := range uint64(5) {
		if err := f.Ingest("gate", seq, time.Now(), frame, nil); err != nil {
			t.Fatalf("ingest %d on the new call: %v", seq, err)
		}
	}
	waitFor(t, "the engine to take gate's frames", 10*time.Second, func() bool {
		for _, s := range c.e.Status().Sessions {
			if s.App == "traffic" && s.Total.Sent >= 5 {
				return true
			}
		}
		return false
	})
	if err := f.Leave("gate"); err != nil {
		t.Fatal(err)
	}
}
