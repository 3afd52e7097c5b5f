package synth

import (
	"context"
	"testing"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

func TestPattern(t *testing.T) {
	if _, err := NewPattern(8, 8, 1); err == nil {
		t.Fatal("accepted an 8x8 pattern")
	}
	if _, err := NewPattern(64, 64, -1); err == nil {
		t.Fatal("accepted -1 objects")
	}
	p, err := NewPattern(160, 120, 3)
	if err != nil {
		t.Fatal(err)
	}
	f, truth, err := p.Frame(0, 7)
	if err != nil || f.Valid() != nil || len(truth) != 3 {
		t.Fatalf("%v %d", err, len(truth))
	}
	// The shapes are drawn where the truth says: the centre of each box is
	// not black.
	for _, b := range truth {
		i := ((b.Y+b.H/2)*f.W + b.X + b.W/2) * 3
		if f.Pix[i] == 0 && f.Pix[i+1] == 0 && f.Pix[i+2] == 0 {
			t.Errorf("nothing drawn at %+v", b)
		}
	}
	p.SetObjects(8)
	if _, truth, _ := p.Frame(1, 0); len(truth) != 8 {
		t.Fatalf("%d objects after SetObjects(8)", len(truth))
	}
	// Generate paces frames on the injected clock and stops at count.
	clk := clock.NewFake(time.Unix(0, 0))
	var seqs []uint64
	var at []time.Time
	errc := make(chan error, 1)
	go func() {
		errc <- p.Generate(context.Background(), clk, 0, "s", 10, 3, func(_ string, seq uint64, c time.Time, _ *media.Frame, _ []media.Box) error {
			seqs, at = append(seqs, seq), append(at, c)
			return nil
		})
	}()
	for {
		select {
		case err := <-errc:
			if err != nil || len(seqs) != 3 || at[2].Sub(at[0]) != 200*time.Millisecond {
				t.Fatalf("%v %v %v", err, seqs, at)
			}
			return
		default:
			clk.Advance(10 * time.Millisecond)
			<-time.After(time.Millisecond)
		}
	}
}
