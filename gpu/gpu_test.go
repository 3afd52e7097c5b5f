package gpu

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

func TestEmulated(t *testing.T) {
	clk := clock.NewFake(time.Unix(0, 0))
	lat := func(model string, b int) (time.Duration, bool) {
		return time.Duration(b) * 10 * time.Millisecond, model == "det"
	}
	e := NewEmulated(clk, lat)
	e.SetSlowdown(1.5)
	frame := &media.Item{Seq: 1, Truth: []media.Box{{Class: "car"}, {Class: "person"}}}
	crop := &media.Item{Seq: 2, Region: &media.Box{Class: "bus"}}
	type res struct {
		out [][]*media.Item
		err error
	}
	done := make(chan res, 1)
	go func() {
		out, err := e.Run(context.Background(), "det", []*media.Item{frame, crop})
		done <- res{out, err}
	}()
	// The batch takes 1.5 x l(2) = 30 ms of the fake clock.
	for clk.Pending() == 0 {
		<-time.After(time.Millisecond)
	}
	clk.Advance(29 * time.Millisecond)
	select {
	case <-done:
		t.Fatal("finished before l(b) x slowdown")
	default:
	}
	clk.Advance(time.Millisecond)
	r := <-done
	if r.err != nil || len(r.out) != 2 || len(r.out[0][0].Boxes) != 2 || r.out[1][0].Labels[0] != "bus" {
		t.Fatalf("%v %+v", r.err, r.out)
	}
	if _, err := e.Run(context.Background(), "other", []*media.Item{frame}); err == nil {
		t.Fatal("ran a model without a profile")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.Run(ctx, "det", []*media.Item{frame}); err == nil {
		t.Fatal("a cancelled run succeeded")
	}
}

type kindExec string

func (k kindExec) Kind() string { return string(k) }
func (k kindExec) Run(_ context.Context, model string, items []*media.Item) ([][]*media.Item, error) {
	out := make([][]*media.Item, len(items))
	for i := range items {
		out[i] = []*media.Item{{Labels: []string{string(k) + ":" + model}}}
	}
	return out, nil
}

func TestRouter(t *testing.T) {
	r := &Router{By: map[string]Executor{"det": kindExec("emulated")}, Default: kindExec("kserve")}
	if k := r.Kind(); k != "kserve+emulated" {
		t.Errorf("Kind = %q, want kserve+emulated", k)
	}
	for model, want := range map[string]string{"det": "emulated:det", "resnet50": "kserve:resnet50"} {
		out, err := r.Run(context.Background(), model, []*media.Item{{}})
		if err != nil || len(out) != 1 || out[0][0].Labels[0] != want {
			t.Errorf("Run(%s) = %v, %v; want %s", model, out, err, want)
		}
	}
	if _, err := (&Router{}).Run(context.Background(), "x", nil); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("Router without a default: %v", err)
	}
}
