package dashboard

import (
	"bytes"
	"image"
	"image/jpeg"
	"net/http"
	"sync"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/media"
)

// ThumbWidth is a thumbnail's width in pixels (height keeps the aspect).
const ThumbWidth = 160

// thumbEvery is how often a stream's thumbnail is refreshed; thumbTTL how
// long one is kept after its stream stops sending.
const (
	thumbEvery = time.Second
	thumbTTL   = 30 * time.Second
)

// Encoder scales a frame to width pixels (the aspect kept) and encodes it
// as a JPEG. The full binary injects OpenCV's (cv.Thumbnail, about 1 ms for
// 640x480); the default is pure Go (JPEG).
type Encoder func(f *media.Frame, width int) ([]byte, error)

// JPEG is the pure-Go Encoder: an area-average downscale, then image/jpeg
// at quality 70.
func JPEG(f *media.Frame, width int) ([]byte, error) {
	if err := f.Valid(); err != nil {
		return nil, err
	}
	w := max(1, min(width, f.W))
	small, err := media.ScaleArea(f, w, max(1, f.H*w/f.W))
	if err != nil {
		return nil, err
	}
	img := image.NewRGBA(image.Rect(0, 0, small.W, small.H))
	for i, o := 0, 0; i < len(small.Pix); i, o = i+3, o+4 {
		img.Pix[o], img.Pix[o+1], img.Pix[o+2], img.Pix[o+3] = small.Pix[i+2], small.Pix[i+1], small.Pix[i], 255
	}
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, img, &jpeg.Options{Quality: 70}); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Thumbs keeps a small JPEG of each stream's latest frame. Offer is cheap
// when the stream's thumbnail is fresh (a map lookup); otherwise it scales
// the frame down and encodes it with its Encoder (BenchmarkThumbOffer), at
// most once a second per stream. The boxes of the stream's latest result
// (SetBoxes) are drawn on it.
type Thumbs struct {
	clk   clock.Clock
	enc   Encoder
	mu    sync.Mutex
	m     map[string]*thumb
	boxes map[string][]media.Box
	watch func()    // SetWatch's
	swept time.Time // Put's last sweep of the expired
}

// SetWatch sets f to be called whenever the dashboard is read (its history
// or a sample sent to its event stream): thumbnails that come from
// elsewhere (the workers that ingest the streams) are asked for then only.
// Set before serving.
func (t *Thumbs) SetWatch(f func()) {
	t.mu.Lock()
	t.watch = f
	t.mu.Unlock()
}

// watched calls the SetWatch hook, if any.
func (t *Thumbs) watched() {
	t.mu.Lock()
	f := t.watch
	t.mu.Unlock()
	if f != nil {
		f()
	}
}

// Put stores a thumbnail encoded elsewhere (a worker's, of a stream it
// ingests) as stream's latest; the boxes of SetBoxes are not drawn on it.
func (t *Thumbs) Put(stream string, jpeg []byte) {
	if t == nil || len(jpeg) == 0 {
		return
	}
	now := t.clk.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m[stream] = &thumb{jpeg: jpeg, at: now}
	if now.Sub(t.swept) < thumbEvery { // a sweep a second, not one a Put
		return
	}
	t.swept = now
	for id, th := range t.m {
		if now.Sub(th.at) > thumbTTL {
			delete(t.m, id)
			delete(t.boxes, id)
		}
	}
}

type thumb struct {
	jpeg []byte
	at   time.Time
}

// boxColour is the boxes' colour on a thumbnail (BGR: green).
var boxColour = [3]byte{0, 255, 0}

// SetBoxes records the boxes of a stream's latest result (frame
// coordinates, those of the frames offered): the next thumbnail of the
// stream draws them. No boxes clears them.
func (t *Thumbs) SetBoxes(stream string, boxes []media.Box) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(boxes) == 0 {
		delete(t.boxes, stream)
		return
	}
	t.boxes[stream] = append([]media.Box(nil), boxes...)
}

// withBoxes is a copy of f with the boxes' outlines drawn, thick enough
// to stay visible at ThumbWidth.
func withBoxes(f *media.Frame, boxes []media.Box) *media.Frame {
	g := &media.Frame{W: f.W, H: f.H, Pix: append([]byte(nil), f.Pix...)}
	th := max(2, f.W*3/ThumbWidth)
	fill := func(x0, y0, x1, y1 int) {
		x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, f.W), min(y1, f.H)
		for y := y0; y < y1; y++ {
			for x := x0; x < x1; x++ {
				copy(g.Pix[(y*f.W+x)*3:], boxColour[:])
			}
		}
	}
	for _, b := range boxes {
		x1, y1 := b.X+b.W, b.Y+b.H
		fill(b.X, b.Y, x1, b.Y+th)
		fill(b.X, y1-th, x1, y1)
		fill(b.X, b.Y, b.X+th, y1)
		fill(x1-th, b.Y, x1, y1)
	}
	return g
}

// NewThumbs returns an empty store encoding with enc (nil: JPEG).
func NewThumbs(clk clock.Clock, enc Encoder) *Thumbs {
	if enc == nil {
		enc = JPEG
	}
	return &Thumbs{clk: clk, enc: enc, m: map[string]*thumb{}, boxes: map[string][]media.Box{}}
}

// Offer proposes a frame of stream for its thumbnail.
func (t *Thumbs) Offer(stream string, f *media.Frame) {
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
			delete(t.boxes, id)
		}
	}
	boxes := t.boxes[stream]
	t.mu.Unlock()
	if len(boxes) > 0 {
		f = withBoxes(f, boxes)
	}
	jpeg, err := t.enc(f, ThumbWidth)
	if err != nil {
		return
	}
	t.mu.Lock()
	if th := t.m[stream]; th != nil {
		th.jpeg = jpeg
	}
	t.mu.Unlock()
}

// Get returns a stream's thumbnail (nil when there is none, or it is over
// 30 s old).
func (t *Thumbs) Get(stream string) []byte {
	now := t.clk.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if th := t.m[stream]; th != nil && now.Sub(th.at) <= thumbTTL {
		return th.jpeg
	}
	return nil
}

// Have lists the streams of ids that have a thumbnail.
func (t *Thumbs) Have(ids []string) []string {
	now := t.clk.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []string{}
	for _, id := range ids {
		if th := t.m[id]; th != nil && th.jpeg != nil && now.Sub(th.at) <= thumbTTL {
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
