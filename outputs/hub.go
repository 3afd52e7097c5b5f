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
	// SendTimeout bounds one Send of a batch (0: 30 s); a webhook's
	// per-request timeout times a few.
	SendTimeout time.Duration
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
	cfg     Config
	clk     clock.Clock
	log     *slog.Logger
	in      chan Result
	stopIn  chan struct{} // Close: make messages of what is queued, then stop
	done    chan struct{} // then: the runners and ticks stop
	produce sync.WaitGroup
	wg      sync.WaitGroup
	outs    []*runner
	closed  sync.Once
	mu      sync.RWMutex // Add's send against Close
	closing bool
}

// Start starts the hub's goroutines: one that makes messages, and a runner
// per output.
func Start(cfg Config) (*Hub, error) {
	if len(cfg.Outputs) == 0 {
		return nil, errors.New("outputs: none")
	}
	h := &Hub{cfg: cfg, clk: cfg.Clock, log: cfg.Log, stopIn: make(chan struct{}), done: make(chan struct{})}
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
		if o.SendTimeout <= 0 {
			o.SendTimeout = 30 * time.Second
		}
		r := &runner{Output: o, h: h, log: h.log.With("output", o.Name, "to", o.Transport.Describe()), wake: make(chan struct{}, 1), fresh: map[string]bool{}}
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
	h.produce.Add(1)
	go h.run(ticks)
	for _, r := range h.outs {
		h.wg.Add(1)
		go r.run()
	}
	return h, nil
}

// Add hands the hub a frame's result. It never blocks: a result that
// finds the queue full is dropped and counted (busy) for every output it
// would have made a message for; after Close it is counted the same way.
func (h *Hub) Add(r Result) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if !h.closing {
		select {
		case h.in <- r:
			return
		default:
		}
	}
	for _, o := range h.outs {
		if !o.wants(r) {
			continue
		}
		o.mu.Lock()
		o.st.DroppedBusy++
		n := o.st.DroppedBusy
		o.mu.Unlock()
		if n == 1 || n%1000 == 0 {
			o.log.Warn("results arrive faster than they become messages (or after the outputs closed): dropping them (counted: dropped busy)", "queue", h.cfg.Queue, "dropped", n)
		}
	}
}

// Queued is how many results wait to become messages.
func (h *Hub) Queued() int { return len(h.in) }

// Close makes messages of the results queued, stops the runners
// (messages not yet sent stay in the spools for the next start), and
// closes transports and spools.
func (h *Hub) Close() {
	h.closed.Do(func() {
		h.mu.Lock()
		h.closing = true
		h.mu.Unlock()
		close(h.stopIn)
		h.produce.Wait() // every queued result is in a spool now
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
	seen    time.Time // the hub's clock at its latest result
}

// forgetAfter is how long a stream that sends nothing is remembered (its
// counts: the next result after that sends them again).
const forgetAfter = 10 * time.Minute

// run makes each output's messages from the results, in order, and each
// stream's state on its outputs' intervals; on Close it makes messages of
// what is queued first.
func (h *Hub) run(ticks []tick) {
	defer h.produce.Done()
	streams := map[string]*streamState{}
	stateTick := make(chan *runner, len(ticks))
	for i := range ticks {
		h.wg.Add(1)
		go func(t tick) {
			defer h.wg.Done()
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
	drain := func() {
		for {
			select {
			case r := <-h.in:
				h.result(r, streams)
			default:
				return
			}
		}
	}
	for {
		select {
		case <-h.stopIn:
			drain()
			return
		case r := <-h.in:
			h.result(r, streams)
		case o := <-stateTick:
			drain() // results that came before the tick count in it
			now := h.clk.Now()
			for _, id := range slices.Sorted(maps.Keys(o.fresh)) {
				if s := streams[id]; s != nil {
					o.add(Body{Kind: KindState, Stream: id, Seq: s.seq, Capture: s.capture, Counts: orEmpty(s.counts)}, h.cfg.App, now)
				}
			}
			clear(o.fresh)
			for id, s := range streams {
				if now.Sub(s.seen) > forgetAfter {
					delete(streams, id)
				}
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
		s.counts, s.seq, s.capture, s.seen = maps.Clone(r.Counts), r.Seq, capture, now
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
			case KindState:
				if completed {
					o.fresh[r.Stream] = true
				}
			}
		}
	}
}

// wants reports whether r would make a message of this output (what a
// dropped result costs it).
func (r *runner) wants(res Result) bool {
	for _, k := range r.Kinds {
		if k != KindEvent || len(res.Events) > 0 {
			return true
		}
	}
	return false
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
	Corrupt     uint64    `json:"corrupt"`              // damaged stretches of the spool skipped (on start, or found when read)
	Unspooled   uint64    `json:"unspooled"`            // messages that could not be spooled (too large for it, a disk error)
	Queued      int       `json:"queued"`               // results waiting to become messages
	Waiting     int       `json:"waiting"`              // messages in the spool
	SpoolBytes  int64     `json:"spool_bytes"`
	LagSeconds  float64   `json:"lag_seconds"` // the oldest waiting message's age
}

// Dropped is every message (or result) the output lost, by any reason.
func (s Status) Dropped() uint64 {
	return s.Rejected + s.DroppedFull + s.Expired + s.DroppedBusy + s.Corrupt + s.Unspooled
}

// Status is each output's figures, in the configured order.
func (h *Hub) Status() []Status {
	now := h.clk.Now()
	out := make([]Status, 0, len(h.outs))
	for _, r := range h.outs {
		r.mu.Lock()
		st := r.st
		r.mu.Unlock()
		sp := r.Spool.Stats()
		st.Name, st.To, st.Kinds, st.Queued = r.Name, r.Transport.Describe(), r.Kinds, len(h.in)
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
	// fresh are the streams with a result since this output's last state
	// tick (the hub's goroutine alone uses it)
	fresh map[string]bool
}

// add makes b a message of this output and appends it to the spool; one
// that cannot be spooled is counted (a full drop-newest spool counts its
// own).
func (r *runner) add(b Body, app string, now time.Time) {
	b.Schema, b.App, b.Time, b.ID = Schema, app, now, newID(now)
	data, err := json.Marshal(b)
	if err == nil {
		err = r.Spool.Append(data)
	}
	if err != nil {
		full := errors.Is(err, spool.ErrFull)
		r.mu.Lock()
		r.st.LastError = "spool: " + err.Error()
		if !full {
			r.st.Unspooled++
		}
		n := r.st.Unspooled
		r.mu.Unlock()
		if !full && (n == 1 || n%100 == 0) {
			r.log.Error("a message could not be spooled: it is lost (counted: unspooled)", "kind", b.Kind, "stream", b.Stream, "err", err, "unspooled", n)
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
		if err == nil || (acked > 0 && !IsPermanent(err)) {
			// delivered, or some of it: the destination answers (a slow
			// one runs out of the batch's time); the rest goes next
			if backoff > 0 || !r.connected() {
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
	ctx, cancel := contextUntil(r.h.done, r.SendTimeout)
	defer cancel()
	return r.Transport.Send(ctx, msgs)
}

// ack takes n sent (or rejected) messages out of the spool; only those
// still there count (the full policy may have dropped some meanwhile,
// counted as such).
func (r *runner) ack(n int, rejected bool) {
	k, err := r.Spool.AckCount(n)
	if err != nil {
		r.log.Error("acknowledging in the spool", "err", err)
	}
	r.mu.Lock()
	if rejected {
		r.st.Rejected += uint64(k)
	} else {
		r.st.Published += uint64(k)
	}
	r.mu.Unlock()
}

func (r *runner) connected() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st.Connected
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

// sleep waits d on the hub's clock, syncing the spool each second of it
// (what came in while the destination was down is on disk); false when
// the hub closes first.
func (r *runner) sleep(d time.Duration) bool {
	end := r.h.clk.Now().Add(d)
	for {
		left := end.Sub(r.h.clk.Now())
		if left <= 0 {
			return true
		}
		select {
		case <-r.h.done:
			return false
		case <-r.h.clk.After(min(left, time.Second)):
		}
		if err := r.Spool.Sync(); err != nil {
			r.log.Warn("syncing the spool", "err", err)
		}
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
