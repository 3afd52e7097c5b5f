package outputs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/outputs/spool"
)

// Output is one destination with what it sends and its spool.
type Output struct {
	Name      string
	Kinds     []string      // Kinds
	Every     time.Duration // state's interval
	Transport Transport
	Spool     *spool.Spool // the output's own: Close closes it
}

// Config configures a Hub.
type Config struct {
	App     string
	Outputs []Output
	Clock   clock.Clock  // nil: the wall clock
	Log     *slog.Logger // nil: discarded
	// Backoff bounds the wait between failed sends (doubling from Min to
	// Max; zero: 200 ms to 30 s).
	BackoffMin, BackoffMax time.Duration
	// Queue bounds the results waiting to become messages (0: 4096); a
	// result over it is dropped for every output and counted (busy).
	Queue int
}

// Hub turns results into messages for each output and runs each
// output's delivery.
type Hub struct {
	cfg    Config
	clk    clock.Clock
	log    *slog.Logger
	in     chan Result
	done   chan struct{}
	wg     sync.WaitGroup
	outs   []*runner
	closed sync.Once
}

// Start starts the hub's goroutines: one that makes messages, and a runner
// per output.
func Start(cfg Config) (*Hub, error) {
	if len(cfg.Outputs) == 0 {
		return nil, errors.New("outputs: none")
	}
	h := &Hub{cfg: cfg, clk: cfg.Clock, log: cfg.Log, done: make(chan struct{})}
	if h.clk == nil {
		h.clk = clock.Real{}
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.cfg.Queue <= 0 {
		h.cfg.Queue = 4096
	}
	if h.cfg.BackoffMin <= 0 {
		h.cfg.BackoffMin = 200 * time.Millisecond
	}
	if h.cfg.BackoffMax < h.cfg.BackoffMin {
		h.cfg.BackoffMax = max(30*time.Second, h.cfg.BackoffMin)
	}
	h.in = make(chan Result, h.cfg.Queue)
	for _, o := range cfg.Outputs {
		if o.Transport == nil || o.Spool == nil {
			return nil, fmt.Errorf("outputs: %s: no transport or spool", o.Name)
		}
		r := &runner{Output: o, h: h, log: h.log.With("output", o.Name, "to", o.Transport.Describe()), wake: make(chan struct{}, 1)}
		r.st.Connected = true // until a send says otherwise
		h.outs = append(h.outs, r)
	}
	// the state ticks' first timers are armed before Start returns
	var ticks []tick
	for _, r := range h.outs {
		if slices.Contains(r.Kinds, KindState) && r.Every > 0 {
			ticks = append(ticks, tick{r, h.clk.After(r.Every)})
		}
	}
	h.wg.Add(1)
	go h.produce(ticks)
	for _, r := range h.outs {
		h.wg.Add(1)
		go r.run()
	}
	return h, nil
}

// Add hands the hub a frame's result. It never blocks: a result that
// finds the queue full is dropped for every output and counted.
func (h *Hub) Add(r Result) {
	select {
	case <-h.done:
		return
	default:
	}
	select {
	case h.in <- r:
	default:
		for _, o := range h.outs {
			o.mu.Lock()
			o.st.DroppedBusy++
			first := o.st.DroppedBusy == 1
			o.mu.Unlock()
			if first {
				o.log.Warn("results arrive faster than they become messages: dropping results (counted: dropped_busy)", "queue", h.cfg.Queue)
			}
		}
	}
}

// Close stops making messages, stops the runners (messages not yet sent
// stay in the spools for the next start), and closes transports and
// spools.
func (h *Hub) Close() {
	h.closed.Do(func() {
		close(h.done)
		h.wg.Wait()
		for _, r := range h.outs {
			if err := r.Spool.Close(); err != nil {
				r.log.Warn("closing the spool", "err", err)
			}
			if err := r.Transport.Close(); err != nil {
				r.log.Debug("closing the transport", "err", err)
			}
		}
	})
}

// tick is an output's next state tick.
type tick struct {
	r  *runner
	ch <-chan time.Time
}

// streamState is what the hub remembers of a stream: its counts (to send
// them on change) and its latest frame (for state).
type streamState struct {
	counts  map[string]int
	seq     uint64
	capture time.Time
	fresh   bool // a result since the last state tick
}

// produce makes each output's messages from the results, in order, and
// each stream's state on its outputs' intervals.
func (h *Hub) produce(ticks []tick) {
	defer h.wg.Done()
	streams := map[string]*streamState{}
	stateTick := make(chan *runner, len(ticks))
	for i := range ticks {
		go func(t tick) {
			for {
				select {
				case <-h.done:
					return
				case <-t.ch:
				}
				select {
				case stateTick <- t.r:
				case <-h.done:
					return
				}
				t.ch = h.clk.After(t.r.Every)
			}
		}(ticks[i])
	}
	for {
		select {
		case <-h.done:
			return
		case r := <-h.in:
			h.result(r, streams)
		case o := <-stateTick:
			// results that came before the tick count in it
			for drained := false; !drained; {
				select {
				case r := <-h.in:
					h.result(r, streams)
				default:
					drained = true
				}
			}
			now := h.clk.Now()
			for _, id := range slices.Sorted(maps.Keys(streams)) {
				s := streams[id]
				if !s.fresh {
					delete(streams, id) // gone quiet: no state until it sends again
					continue
				}
				o.add(Body{Kind: KindState, Stream: id, Seq: s.seq, Capture: s.capture, Counts: orEmpty(s.counts)}, h.cfg.App, now)
			}
			for _, s := range streams {
				s.fresh = false
			}
		}
	}
}

func orEmpty(m map[string]int) map[string]int {
	if m == nil {
		return map[string]int{}
	}
	return m
}

func (h *Hub) result(r Result, streams map[string]*streamState) {
	now := h.clk.Now()
	capture := r.Finished.Add(-r.Latency)
	completed := r.Outcome != "dropped"
	s := streams[r.Stream]
	changed := false
	if completed {
		if s == nil {
			s = &streamState{}
			streams[r.Stream] = s
			changed = true
		}
		if !maps.Equal(orEmpty(s.counts), orEmpty(r.Counts)) {
			changed = true
		}
		s.counts, s.seq, s.capture, s.fresh = maps.Clone(r.Counts), r.Seq, capture, true
	}
	base := Body{Stream: r.Stream, Seq: r.Seq, Capture: capture}
	for _, o := range h.outs {
		for _, k := range o.Kinds {
			switch k {
			case KindEvent:
				for _, e := range events(r.Events) {
					b := base
					b.Kind, b.Event = KindEvent, &e
					o.add(b, h.cfg.App, now)
				}
			case KindCounts:
				if completed && changed {
					b := base
					b.Kind, b.Counts = KindCounts, orEmpty(r.Counts)
					o.add(b, h.cfg.App, now)
				}
			case KindFrame:
				b := base
				b.Kind, b.Frame = KindFrame, frameOf(r)
				o.add(b, h.cfg.App, now)
			}
		}
	}
}

// Status is an output's figures, for the status API, the dashboard and
// the metrics.
type Status struct {
	Name        string    `json:"name"`
	To          string    `json:"to"` // the destination, without secrets
	Kinds       []string  `json:"send"`
	Connected   bool      `json:"connected"`            // the last send went through (or none failed yet)
	DownSince   time.Time `json:"down_since,omitzero"`  // since when sends fail
	LastError   string    `json:"last_error,omitempty"` // the last failure
	Published   uint64    `json:"published"`            // acknowledged by the destination
	Retried     uint64    `json:"retried"`              // sends that failed and were tried again
	Rejected    uint64    `json:"rejected"`             // refused for good by the destination (dropped)
	DroppedFull uint64    `json:"dropped_full"`         // dropped by the spool's when_full policy
	Expired     uint64    `json:"expired"`              // dropped for waiting longer than max_age
	DroppedBusy uint64    `json:"dropped_busy"`         // results dropped before they became messages
	Corrupt     uint64    `json:"corrupt"`              // damaged records skipped in the spool on start
	Waiting     int       `json:"waiting"`              // messages in the spool
	SpoolBytes  int64     `json:"spool_bytes"`
	LagSeconds  float64   `json:"lag_seconds"` // the oldest waiting message's age
}

// Dropped is every message (or result) the output lost, by any reason.
func (s Status) Dropped() uint64 { return s.Rejected + s.DroppedFull + s.Expired + s.DroppedBusy }

// Status is each output's figures, in the configured order.
func (h *Hub) Status() []Status {
	now := h.clk.Now()
	out := make([]Status, 0, len(h.outs))
	for _, r := range h.outs {
		r.mu.Lock()
		st := r.st
		r.mu.Unlock()
		sp := r.Spool.Stats()
		st.Name, st.To, st.Kinds = r.Name, r.Transport.Describe(), r.Kinds
		st.DroppedFull, st.Expired, st.Corrupt, st.Waiting, st.SpoolBytes = sp.DroppedFull, sp.Expired, sp.Corrupt, sp.Waiting, sp.Bytes
		if !sp.Oldest.IsZero() && sp.Waiting > 0 {
			st.LagSeconds = max(0, now.Sub(sp.Oldest).Seconds())
		}
		out = append(out, st)
	}
	return out
}

// runner delivers one output's spool.
type runner struct {
	Output
	h    *Hub
	log  *slog.Logger
	wake chan struct{}
	mu   sync.Mutex
	st   Status // the counters the runner keeps (the spool keeps the rest)
	made uint64
}

// add makes b a message of this output and appends it to the spool.
func (r *runner) add(b Body, app string, now time.Time) {
	b.Schema, b.App, b.Time, b.ID = Schema, app, now, newID(now)
	data, err := json.Marshal(b)
	if err != nil {
		r.log.Error("a message that does not encode", "err", err)
		return
	}
	if err := r.Spool.Append(data); err != nil {
		r.mu.Lock()
		r.st.LastError = "spool: " + err.Error()
		r.mu.Unlock()
		// a full drop-newest spool counts the drop itself; other errors are loud
		if !errors.Is(err, spool.ErrFull) {
			r.log.Error("spooling a message failed: it is lost", "err", err)
		}
		return
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// maxRetryAfter bounds how long a destination's Retry-After holds a
// runner back.
const maxRetryAfter = 5 * time.Minute

// run sends the spool's messages, oldest first, in batches; a failed send
// is tried again after a backoff, from the first message not acknowledged.
func (r *runner) run() {
	defer r.h.wg.Done()
	const batch, batchBytes = 64, 1 << 20
	backoff := time.Duration(0)
	syncAt := r.h.clk.Now().Add(time.Second)
	for {
		if now := r.h.clk.Now(); !now.Before(syncAt) {
			if err := r.Spool.Sync(); err != nil {
				r.log.Warn("syncing the spool", "err", err)
			}
			syncAt = now.Add(time.Second)
		}
		recs, err := r.Spool.Peek(batch, batchBytes)
		if err != nil {
			r.log.Error("reading the spool", "err", err)
			if !r.sleep(time.Second) {
				return
			}
			continue
		}
		if len(recs) == 0 {
			select {
			case <-r.h.done:
				return
			case <-r.wake:
			case <-r.h.clk.After(time.Second): // the periodic sync, expiry
			}
			continue
		}
		msgs := make([]Message, 0, len(recs))
		bad := 0
		for _, rec := range recs {
			m, err := message(rec.Payload)
			if err != nil {
				bad++ // unreadable: nothing can send it
				r.log.Error("dropping a spooled message", "err", err)
				break
			}
			msgs = append(msgs, m)
		}
		if bad > 0 && len(msgs) == 0 {
			r.ack(1, true)
			continue
		}
		acked, err := r.send(msgs)
		if acked > 0 {
			r.ack(acked, false)
		}
		if err == nil {
			if backoff > 0 {
				r.up()
			}
			backoff = 0
			continue
		}
		if IsPermanent(err) && acked < len(msgs) {
			r.log.Warn("the destination refused a message for good: dropped (counted: rejected)", "id", msgs[acked].ID, "err", err)
			r.ack(1, true)
			continue
		}
		backoff = min(max(2*backoff, r.h.cfg.BackoffMin), r.h.cfg.BackoffMax)
		wait := backoff
		var ra interface{ RetryAfter() time.Duration }
		if errors.As(err, &ra) { // the destination says when (429, 503): up to 5 minutes
			wait = max(wait, min(ra.RetryAfter(), maxRetryAfter))
		}
		r.down(err, len(msgs)-acked, wait)
		if !r.sleep(wait) {
			return
		}
	}
}

// send sends one batch, bounded in time so a Close is not held up long.
func (r *runner) send(msgs []Message) (int, error) {
	ctx, cancel := contextUntil(r.h.done, 30*time.Second)
	defer cancel()
	return r.Transport.Send(ctx, msgs)
}

func (r *runner) ack(n int, rejected bool) {
	if err := r.Spool.Ack(n); err != nil {
		r.log.Error("acknowledging in the spool", "err", err)
	}
	r.mu.Lock()
	if rejected {
		r.st.Rejected += uint64(n)
	} else {
		r.st.Published += uint64(n)
	}
	r.mu.Unlock()
}

func (r *runner) down(err error, pending int, wait time.Duration) {
	r.mu.Lock()
	r.st.Retried++
	r.st.LastError = err.Error()
	was := r.st.Connected
	if was {
		r.st.Connected, r.st.DownSince = false, r.h.clk.Now()
	}
	r.mu.Unlock()
	if was {
		r.log.Warn("output down: messages wait in the spool and are sent again when it is back", "err", err, "unsent", pending, "retry_in", wait)
	} else {
		r.log.Debug("output still down", "err", err, "retry_in", wait)
	}
}

func (r *runner) up() {
	r.mu.Lock()
	since := r.st.DownSince
	r.st.Connected, r.st.DownSince = true, time.Time{}
	r.mu.Unlock()
	sp := r.Spool.Stats()
	r.log.Info("output back: sending what waited", "down_for", r.h.clk.Now().Sub(since).Round(time.Millisecond), "waiting", sp.Waiting)
}

// sleep waits d on the hub's clock; false when the hub closes first.
func (r *runner) sleep(d time.Duration) bool {
	select {
	case <-r.h.done:
		return false
	case <-r.h.clk.After(d):
		return true
	}
}

// contextUntil is a context that ends when done closes or after d.
func contextUntil(done <-chan struct{}, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
