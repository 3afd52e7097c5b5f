package metrics

import (
	"slices"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// Egress is one app's WHEP (annotated video out) figures at scrape time
// (egress/whep's Stats).
type Egress struct {
	App          string
	Viewers      int
	Streams      int               // streams being encoded (watched)
	Refused      map[string]uint64 // viewers refused, by reason
	Encoded      uint64            // frames encoded (once per stream, for all its viewers)
	EncodedBytes uint64
	Errors       uint64 // encoder errors (frames not sent)
	Evicted      uint64 // frames the ring's bounds evicted before their result came
	Skipped      uint64 // frames replaced while the encoder was busy
}

// SetEgress registers the source of WHEP's figures.
func (m *Metrics) SetEgress(f func() []Egress) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.egress = f
	m.mu.Unlock()
}

var (
	egressViewers = desc("egress", "viewers", "WHEP viewers (annotated video out) connected or connecting now.", "app")
	egressStreams = desc("egress", "streams", "Streams being encoded for WHEP viewers now (one encoder a stream, shared by its viewers).", "app")
	egressRefused = desc("egress", "viewers_refused_total",
		"WHEP viewers refused, by reason: full (the server's viewer limit, 503), stream_full (the stream's viewer limit, 503), unknown_stream (no such app or live stream, 404), bad_offer (400, 415).", "app", "reason")
	egressEncoded = desc("egress", "frames_encoded_total", "Annotated frames encoded for WHEP viewers (once a stream, whatever its viewers).", "app")
	egressBytes   = desc("egress", "encoded_bytes_total", "Bytes of encoded WHEP video (once a stream).", "app")
	egressErrors  = desc("egress", "encode_errors_total", "Frames the WHEP encoder could not encode or send (viewers miss them).", "app")
	egressEvicted = desc("egress", "frames_evicted_total", "Watched frames the egress ring evicted (its frame, byte or age bound) before their result came: viewers never see them.", "app")
	egressSkipped = desc("egress", "frames_skipped_total", "Annotated frames replaced by a newer one while the WHEP encoder was busy (it cannot keep up).", "app")
)

type egressCollector struct{ m *Metrics }

func (egressCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{egressViewers, egressStreams, egressRefused, egressEncoded, egressBytes, egressErrors, egressEvicted, egressSkipped} {
		ch <- d
	}
}

// egressReasons are always exposed (0 until a refusal), so a rate() has
// a series to start from.
var egressReasons = []string{"bad_offer", "full", "stream_full", "unknown_stream"}

func (c egressCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	f := c.m.egress
	c.m.mu.Unlock()
	if f == nil {
		return
	}
	for _, e := range f() {
		ch <- prometheus.MustNewConstMetric(egressViewers, prometheus.GaugeValue, float64(e.Viewers), e.App)
		ch <- prometheus.MustNewConstMetric(egressStreams, prometheus.GaugeValue, float64(e.Streams), e.App)
		reasons := append([]string(nil), egressReasons...)
		for r := range e.Refused {
			if !slices.Contains(reasons, r) {
				reasons = append(reasons, r)
			}
		}
		sort.Strings(reasons)
		for _, r := range reasons {
			ch <- prometheus.MustNewConstMetric(egressRefused, prometheus.CounterValue, float64(e.Refused[r]), e.App, r)
		}
		ch <- prometheus.MustNewConstMetric(egressEncoded, prometheus.CounterValue, float64(e.Encoded), e.App)
		ch <- prometheus.MustNewConstMetric(egressBytes, prometheus.CounterValue, float64(e.EncodedBytes), e.App)
		ch <- prometheus.MustNewConstMetric(egressErrors, prometheus.CounterValue, float64(e.Errors), e.App)
		ch <- prometheus.MustNewConstMetric(egressEvicted, prometheus.CounterValue, float64(e.Evicted), e.App)
		ch <- prometheus.MustNewConstMetric(egressSkipped, prometheus.CounterValue, float64(e.Skipped), e.App)
	}
}
