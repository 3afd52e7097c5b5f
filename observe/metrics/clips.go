package metrics

import "github.com/prometheus/client_golang/prometheus"

// Clips is one app's event clips' figures at scrape time (clips.Stats).
type Clips struct {
	App             string
	Streams         int   // streams being recorded
	Frames          int64 // encoded into the streams' rings
	FramesDropped   int64 // not recorded: the stream's encoder was behind
	EncodeErrors    int64 // not recorded: no pixels, encoder errors
	Written         int64 // clips written
	WrittenBytes    int64
	WriteErrors     int64 // clips lost: disk errors, the writer behind
	Limited         int64 // events past max_clips_per_stream_per_minute: no clip
	Missed          int64 // events with no video recorded: no clip
	RemovedForBytes int64 // clips retention removed to fit max_bytes
	RemovedForAge   int64 // clips retention removed as older than max_age
	RemovedBytes    int64
	RingDrops       int64 // GOPs dropped from the rings to fit their bytes
	StoredBytes     int64 // the clips on disk
}

// SetClips registers the source of the clips' figures.
func (m *Metrics) SetClips(f func() []Clips) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.clips = f
	m.mu.Unlock()
}

var (
	clipsStreams       = desc("clips", "recording_streams", "Streams whose video is being recorded for event clips (each with its encoder goroutine).", "app")
	clipsFrames        = desc("clips", "frames_total", "Frames encoded into the streams' clip rings.", "app")
	clipsFramesDropped = desc("clips", "frames_dropped_total", "Frames not recorded, by reason: behind (the stream's encoder queue was full: the ingest path never waits for it), error (no pixels, encoder errors). Clips that span them say so in frames_dropped.", "app", "reason")
	clipsWritten       = desc("clips", "written_total", "Event clips written (MP4 and JSON).", "app")
	clipsWrittenBytes  = desc("clips", "written_bytes_total", "Bytes of the event clips' MP4s written.", "app")
	clipsWriteErrors   = desc("clips", "write_errors_total", "Event clips lost: disk errors, or the writer's queue full.", "app")
	clipsSkipped       = desc("clips", "events_skipped_total", "Events the clips are on that made no clip, by reason: limited (max_clips_per_stream_per_minute), no-video (nothing recorded of the stream yet).", "app", "reason")
	clipsRemoved       = desc("clips", "removed_total", "Event clips retention removed, by reason: bytes (to fit max_bytes), age (older than max_age).", "app", "reason")
	clipsRemovedBytes  = desc("clips", "removed_bytes_total", "Bytes of the event clips retention removed.", "app")
	clipsRingDrops     = desc("clips", "ring_dropped_total", "Key-frame groups dropped from the front of a stream's ring to fit its bytes (less pre-roll than asked for).", "app")
	clipsStoredBytes   = desc("clips", "stored_bytes", "Bytes of the event clips in the clips directory.", "app")
)

type clipCollector struct{ m *Metrics }

func (clipCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{clipsStreams, clipsFrames, clipsFramesDropped, clipsWritten, clipsWrittenBytes, clipsWriteErrors, clipsSkipped, clipsRemoved, clipsRemovedBytes, clipsRingDrops, clipsStoredBytes} {
		ch <- d
	}
}

func (c clipCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	f := c.m.clips
	c.m.mu.Unlock()
	if f == nil {
		return
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, s := range f() {
		ch <- prometheus.MustNewConstMetric(clipsStreams, prometheus.GaugeValue, float64(s.Streams), s.App)
		counter(clipsFrames, s.Frames, s.App)
		counter(clipsFramesDropped, s.FramesDropped, s.App, "behind")
		counter(clipsFramesDropped, s.EncodeErrors, s.App, "error")
		counter(clipsWritten, s.Written, s.App)
		counter(clipsWrittenBytes, s.WrittenBytes, s.App)
		counter(clipsWriteErrors, s.WriteErrors, s.App)
		counter(clipsSkipped, s.Limited, s.App, "limited")
		counter(clipsSkipped, s.Missed, s.App, "no-video")
		counter(clipsRemoved, s.RemovedForBytes, s.App, "bytes")
		counter(clipsRemoved, s.RemovedForAge, s.App, "age")
		counter(clipsRemovedBytes, s.RemovedBytes, s.App)
		counter(clipsRingDrops, s.RingDrops, s.App)
		ch <- prometheus.MustNewConstMetric(clipsStoredBytes, prometheus.GaugeValue, float64(s.StoredBytes), s.App)
	}
}
