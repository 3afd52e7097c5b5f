package clips

import "time"

// Sample is one encoded access unit of a stream: H.264 in Annex-B form
// (key frames carry SPS and PPS in band).
type Sample struct {
	Seq     uint64
	Capture time.Time
	Key     bool
	Data    []byte
	Gap     int // frames of the stream not recorded just before this one (its encoder behind, errors)
}

// ring is a stream's recent samples: from a key frame at or before Keep
// before the newest sample, and at most MaxBytes (whole GOPs are dropped
// from the front to fit; each drop is counted).
type ring struct {
	keep     time.Duration
	maxBytes int
	samples  []Sample
	bytes    int
	dropped  int // GOPs dropped for bytes
}

// push appends s (a ring starts at a key frame: samples before the first
// key frame are not kept) and trims the front.
func (r *ring) push(s Sample) {
	if len(r.samples) == 0 && !s.Key {
		return
	}
	r.samples = append(r.samples, s)
	r.bytes += len(s.Data)
	// the oldest key frame still needed: the last at or before newest-keep
	cut := s.Capture.Add(-r.keep)
	k := 0
	for i, x := range r.samples {
		if x.Capture.After(cut) {
			break
		}
		if x.Key {
			k = i
		}
	}
	r.drop(k)
	for r.bytes > r.maxBytes {
		next := -1
		for i := 1; i < len(r.samples); i++ {
			if r.samples[i].Key {
				next = i
				break
			}
		}
		if next < 0 { // one GOP over the bound: keep nothing until the next key frame
			next = len(r.samples)
		}
		r.drop(next)
		r.dropped++
	}
}

// drop removes the first n samples.
func (r *ring) drop(n int) {
	if n == 0 {
		return
	}
	for _, x := range r.samples[:n] {
		r.bytes -= len(x.Data)
	}
	clear(r.samples[:n])
	r.samples = r.samples[n:]
	if cap(r.samples) > 4*len(r.samples)+64 { // let the array shrink
		r.samples = append([]Sample(nil), r.samples...)
	}
}

// from returns the samples from the last key frame at or before t (the
// first sample if none is), to the newest; a copy of the slice, sharing
// the data.
func (r *ring) from(t time.Time) []Sample {
	k := 0
	for i, x := range r.samples {
		if x.Capture.After(t) {
			break
		}
		if x.Key {
			k = i
		}
	}
	return append([]Sample(nil), r.samples[k:]...)
}

// capture returns the capture time of frame seq, if the ring holds it.
func (r *ring) capture(seq uint64) (time.Time, bool) {
	for i := len(r.samples) - 1; i >= 0; i-- {
		if r.samples[i].Seq == seq {
			return r.samples[i].Capture, true
		}
	}
	return time.Time{}, false
}

func (r *ring) reset() {
	r.samples, r.bytes = nil, 0
}
