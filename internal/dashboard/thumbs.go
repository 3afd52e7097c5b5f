package dashboard

import (
	"net/http"
	"sync"
	"time"

	"gocv.io/x/gocv"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/modules"
)

// ThumbWidth is a thumbnail's width in pixels (height keeps the aspect).
const ThumbWidth = 160

// thumbEvery is how often a stream's thumbnail is refreshed; thumbTTL how
// long one is kept after its stream stops sending.
const (
	thumbEvery = time.Second
	thumbTTL   = 30 * time.Second
)

// Thumbs keeps a small JPEG of each stream's latest frame. Offer is cheap
// when the stream's thumbnail is fresh (a map lookup); otherwise it scales
// the frame down and encodes it (about 1 ms for 640x480 on a 2-core
// machine, BenchmarkThumbOffer), at most once a second per stream.
type Thumbs struct {
	clk clock.Clock
	mu  sync.Mutex
	m   map[string]*thumb
}

type thumb struct {
	jpeg []byte
	at   time.Time
}

// NewThumbs returns an empty store.
func NewThumbs(clk clock.Clock) *Thumbs { return &Thumbs{clk: clk, m: map[string]*thumb{}} }

// Offer proposes a frame of stream for its thumbnail.
func (t *Thumbs) Offer(stream string, f *modules.Frame) {
	if t == nil || f == nil || f.W <= 0 || f.H <= 0 {
		return
	}
	now := t.clk.Now()
	t.mu.Lock()
	old := t.m[stream]
	if old != nil && now.Sub(old.at) < thumbEvery {
		t.mu.Unlock()
		return
	}
	if old == nil {
		old = &thumb{}
		t.m[stream] = old
	}
	old.at = now // claim the refresh: concurrent offers of the stream skip
	for id, th := range t.m {
		if now.Sub(th.at) > thumbTTL {
			delete(t.m, id)
		}
	}
	t.mu.Unlock()
	h := max(1, f.H*ThumbWidth/f.W)
	small, err := modules.Resize(f, ThumbWidth, h, gocv.InterpolationArea)
	if err != nil {
		return
	}
	mat, err := modules.ToMat(small)
	if err != nil {
		return
	}
	defer mat.Close()
	buf, err := gocv.IMEncodeWithParams(gocv.JPEGFileExt, mat, []int{gocv.IMWriteJpegQuality, 70})
	if err != nil {
		return
	}
	defer buf.Close()
	jpeg := append([]byte(nil), buf.GetBytes()...)
	t.mu.Lock()
	if th := t.m[stream]; th != nil {
		th.jpeg = jpeg
	}
	t.mu.Unlock()
}

// Get returns a stream's thumbnail (nil when there is none).
func (t *Thumbs) Get(stream string) []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	if th := t.m[stream]; th != nil {
		return th.jpeg
	}
	return nil
}

// Have lists the streams of ids that have a thumbnail.
func (t *Thumbs) Have(ids []string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []string{}
	for _, id := range ids {
		if th := t.m[id]; th != nil && th.jpeg != nil {
			out = append(out, id)
		}
	}
	return out
}

func (t *Thumbs) serve(w http.ResponseWriter, r *http.Request) {
	b := t.Get(r.PathValue("stream"))
	if b == nil {
		http.Error(w, "no thumbnail for stream "+r.PathValue("stream")+" (none received in the last 30 s)", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "image/jpeg")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}
