package metrics

import "github.com/prometheus/client_golang/prometheus"

// Output is one app output's figures at scrape time (outputs.Status).
type Output struct {
	App, Name   string
	Connected   bool
	Published   uint64
	Retried     uint64
	Rejected    uint64 // dropped: refused for good by the destination
	DroppedFull uint64 // dropped by the spool's when_full policy
	Expired     uint64 // dropped for waiting past max_age
	DroppedBusy uint64 // results dropped before they became messages
	Corrupt     uint64 // damaged stretches of the spool skipped
	Unspooled   uint64 // messages that could not be spooled
	Waiting     int
	SpoolBytes  int64
	LagSeconds  float64
}

// SetOutputs registers the source of the outputs' figures.
func (m *Metrics) SetOutputs(f func() []Output) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.outputs = f
	m.mu.Unlock()
}

var (
	outputConnected = desc("output", "connected", "1 while the output's last send went through; 0 while its destination is down (messages wait in its spool).", "app", "output")
	outputPublished = desc("output", "published_total", "Messages the output's destination acknowledged (MQTT PUBACK, JetStream ack, the server's read for core NATS, a webhook's 2xx).", "app", "output")
	outputRetried   = desc("output", "retries_total", "Sends that failed and are tried again after a backoff (the messages stay in the spool).", "app", "output")
	outputDropped   = desc("output", "dropped_total", "Messages lost, by reason: rejected (refused for good by the destination), full (the spool's when_full policy), expired (waited past the spool's max_age), busy (results arriving faster than they became messages).", "app", "output", "reason")
	outputWaiting   = desc("output", "spool_messages", "Messages waiting in the output's spool.", "app", "output")
	outputBytes     = desc("output", "spool_bytes", "Bytes of the messages waiting in the output's spool.", "app", "output")
	outputLag       = desc("output", "lag_seconds", "Age of the oldest message waiting in the output's spool (0: none waits).", "app", "output")
)

type outputCollector struct{ m *Metrics }

func (outputCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{outputConnected, outputPublished, outputRetried, outputDropped, outputWaiting, outputBytes, outputLag} {
		ch <- d
	}
}

func (c outputCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	f := c.m.outputs
	c.m.mu.Unlock()
	if f == nil {
		return
	}
	for _, o := range f() {
		up := 0.0
		if o.Connected {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(outputConnected, prometheus.GaugeValue, up, o.App, o.Name)
		ch <- prometheus.MustNewConstMetric(outputPublished, prometheus.CounterValue, float64(o.Published), o.App, o.Name)
		ch <- prometheus.MustNewConstMetric(outputRetried, prometheus.CounterValue, float64(o.Retried), o.App, o.Name)
		for _, d := range []struct {
			reason string
			n      uint64
		}{{"rejected", o.Rejected}, {"full", o.DroppedFull}, {"expired", o.Expired}, {"busy", o.DroppedBusy}, {"corrupt", o.Corrupt}, {"unspooled", o.Unspooled}} {
			ch <- prometheus.MustNewConstMetric(outputDropped, prometheus.CounterValue, float64(d.n), o.App, o.Name, d.reason)
		}
		ch <- prometheus.MustNewConstMetric(outputWaiting, prometheus.GaugeValue, float64(o.Waiting), o.App, o.Name)
		ch <- prometheus.MustNewConstMetric(outputBytes, prometheus.GaugeValue, float64(o.SpoolBytes), o.App, o.Name)
		ch <- prometheus.MustNewConstMetric(outputLag, prometheus.GaugeValue, o.LagSeconds, o.App, o.Name)
	}
}
