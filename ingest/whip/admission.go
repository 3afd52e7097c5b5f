package whip

import (
	"fmt"
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest"
)

// ingest.Admission and overload protection.
//
// A stream is pending from its POST until its first frame decodes; then it
// is admitted: it joins the app's session (Sink.Join), so the planner never
// sees offers that send no media. Pending streams are bounded apart from
// admitted ones (MaxPending) and ended after ConnectTimeout, so offers that
// never connect cannot take the slots of real clients.
//
// Capacity is CPU. Each admitted stream costs this process its VP8
// decoding (every frame: a lower sampled fps saves only the colour
// conversion), motion estimation, and the app's CPU modules on its frames;
// measured on 2 cores, decoding alone was a small part (12 streams of
// 640x480 at 15 fps: 0.76 cores of wall time in the media goroutines while
// the session, short of CPU, finished 67% of its frames). So the server
// samples the process's CPU time (CPUTime, getrusage) every LoadInterval
// into a load in cores (or the machine's busy cores, /proc/stat, when
// larger and the process may use every core: other processes take the same
// cores), against a capacity of CPUCores x CPUCeiling. A new stream's cost
// is the process's load over the admitted streams (StreamCost before one
// was measured); streams admitted less than two intervals ago, and
// pending streams whose media has started, count at that cost until the
// load reflects them. A POST whose predicted load plus its cost does not
// fit gets 503 with Retry-After and the figures; the same check runs again
// when a stream's first frame decodes, before it joins, so a burst of POSTs
// admitted together cannot overshoot. If the load of the last interval
// stays above capacity for ShedAfter (streams raised their resolution, the
// machine got busier), the newest admitted streams are ended with reason
// "overload" (their clients see it), as many as the excess over the
// per-stream cost, never the last one; again after two LoadIntervals if it
// still does not fit: the streams admitted first keep their service
// instead of all collapsing. Each stream's own media-path time (wall time
// per frame, StreamInfo.Load) is reported beside it.

// Admitter is implemented by a Sink that can refuse new streams (the engine when a session is overloaded).
type Admitter interface{ Admit(app dag.AppID) error }

// Saturation is implemented by a Sink that can tell when an app's frames
// reach it too late to be served (the engine: later than half the SLO).
// Whatever the cause (this process's CPU, a busy neighbour, the network),
// the server then sheds the app's newest streams as it does on CPU
// overload: the CPU estimate predicts, this measures the outcome.
type Saturation interface{ Saturated(app dag.AppID) bool }

// Why a POST was refused (the label values of the refused-streams
// counter; a bounded set).
const (
	RefusedStreamLimit  = "stream-limit"  // MaxStreams admitted streams
	RefusedPendingLimit = "pending-limit" // MaxPending streams waiting for their first frame
	RefusedCapacity     = "capacity"      // the CPU-load estimate is full
	RefusedSession      = "session"       // the sink (engine) refused: Admitter
	RefusedRecvonly     = "recvonly"      // the offer does not send video
	RefusedShutdown     = "shutdown"      // the server is closing
	RefusedRateLimit    = "rate-limit"    // too many offers from the client or in all (429)
	RefusedUnauthorized = "unauthorized"  // no valid token for the request (401; WHIP, results, the API)
	RefusedTokenLimit   = "token-limit"   // the token's MaxStreams are live (429)
	RefusedDelegate     = "delegate"      // the ingest workers refused or did not answer the offer (Config.Delegate)
)

// How a stream ended (the label values of the ended-streams counter; a
// bounded set). Kinds other than client, idle and shutdown are refusals
// or degradations.
const (
	EndClient         = "client"          // DELETE, or the peer closed the connection
	EndIdle           = "idle"            // no media for IdleTimeout
	EndConnectTimeout = "connect-timeout" // no first frame within ConnectTimeout of the offer
	EndICEFailed      = "ice-failed"      // the ICE connection failed
	EndJoinFailed     = "join-failed"     // the session refused the stream at its first frame
	EndStreamLimit    = "stream-limit"    // MaxStreams reached when its first frame decoded
	EndCapacity       = "capacity"        // no CPU capacity when its first frame decoded
	EndOverload       = "overload"        // shed: the decoding load stayed above capacity
	EndError          = "error"           // decoder failure, resolution refused
	EndSetupFailed    = "setup-failed"    // the offer could not be answered
	EndShutdown       = "shutdown"        // the server closed
	// EndWorker (delegate.go): a delegated stream's worker ended it, or
	// was lost
)

// loadView is the CPU load at one moment.
type loadView struct {
	measured  float64 // the process's CPU load
	unknown   int     // admitted streams not yet reflected in it, pending streams with media
	cost      float64 // predicted cost of one stream
	capacity  float64
	predicted float64 // measured + unknown x cost
}

func (v loadView) fits() bool { return v.predicted+v.cost <= v.capacity }

func (v loadView) String() string {
	return fmt.Sprintf("CPU load %.2f cores predicted (%.2f measured) of a capacity of %.2f; a new stream needs about %.2f",
		v.predicted, v.measured, v.capacity, v.cost)
}

// loadLocked computes the load without except (s.mu held).
func (s *Server) loadLocked(except *stream) loadView {
	v := loadView{capacity: s.cfg.CPUCores * s.cfg.CPUCeiling, measured: s.cpuLoad}
	var n int
	for _, st := range s.streams {
		if st == except {
			continue
		}
		a := &st.adm
		switch {
		case a.admitted && a.samples >= 2:
			n++
		case a.admitted || a.media:
			v.unknown++
		}
	}
	v.cost = s.cfg.StreamCost
	if n > 0 && s.procLoad > 0 {
		v.cost = s.procLoad / float64(n) // the process's fixed work included: errs on the safe side
	}
	v.predicted = v.measured + float64(v.unknown)*v.cost
	return v
}

// counts returns the admitted and pending streams (s.mu held).
func (s *Server) countsLocked() (admitted, pending int) {
	for _, st := range s.streams {
		if st.adm.admitted {
			admitted++
		} else {
			pending++
		}
	}
	return admitted, pending + s.reserved
}

// countRefused counts a refused POST for app.
func (s *Server) countRefused(app dag.AppID, reason string) {
	s.mu.Lock()
	s.totalsLocked(string(app)).Refused[reason]++
	s.mu.Unlock()
}

// admitFirst decides, at a stream's first decoded frame, whether it joins:
// the stream limit and the decoding capacity are checked again, then the
// sink's Join. It returns the end kind and reason when the stream must
// end.
func (st *stream) admitFirst() (kind, why string) {
	s := st.s
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return EndShutdown, "server shutting down"
	}
	if admitted, _ := s.countsLocked(); admitted >= s.cfg.MaxStreams {
		s.mu.Unlock()
		return EndStreamLimit, fmt.Sprintf("stream limit reached (%d streams) when the first frame decoded", s.cfg.MaxStreams)
	}
	if v := s.loadLocked(st); !v.fits() {
		s.mu.Unlock()
		return EndCapacity, "refused: no CPU capacity: " + v.String()
	}
	st.adm.admitted, st.adm.admittedAt = true, s.clk.Now()
	s.mu.Unlock()
	if err := s.sink.Join(st.app, st.id); err != nil {
		return EndJoinFailed, fmt.Sprintf("joining app %s: %v", st.app, err)
	}
	st.mu.Lock()
	ended := st.ended != ""
	st.inSession = !ended
	st.mu.Unlock()
	if ended { // it ended while joining (DELETE, shutdown): its end did not leave
		if err := s.sink.Leave(st.id); err != nil {
			s.log.Warn(st.what()+" leave", "stream", st.id, "err", err)
		}
		return EndShutdown, "ended while joining"
	}
	s.log.Info(st.what()+" admitted", "app", st.app, "stream", st.id)
	return "", ""
}

// armLoad samples the load every LoadInterval until Close.
func (s *Server) armLoad() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.loadTimer = s.clk.AfterFunc(s.cfg.LoadInterval, func() {
		s.sampleLoad()
		s.armLoad()
	})
}

// sampleLoad measures the CPU load and each stream's media-path load
// since the last sample, and sheds the newest admitted stream when the load
// has stayed above capacity for ShedAfter.
func (s *Server) sampleLoad() {
	// Ask the sink first, never under s.mu (the engine's loop publishes
	// results through the server).
	var saturated []dag.AppID
	if sat, ok := s.sink.(Saturation); ok {
		for _, app := range slices.Sorted(maps.Keys(s.cfg.Apps)) {
			if sat.Saturated(app) {
				saturated = append(saturated, app)
			}
		}
	}
	cpu := s.cfg.CPUTime()
	var mBusy, mTotal time.Duration
	var mCores int
	if s.cfg.MachineCPU != nil {
		mBusy, mTotal, mCores = s.cfg.MachineCPU()
	}
	s.mu.Lock()
	now := s.clk.Now()
	if !s.cpuAt.IsZero() {
		if dt := now.Sub(s.cpuAt); dt > 0 {
			proc := float64(cpu-s.cpuLast) / float64(dt)
			s.cpuRate = proc
			if dTotal := mTotal - s.mTotal; mCores > 0 && dTotal > 0 {
				// Other processes take the same cores (co-located
				// clients, other services): the machine's busy share
				// counts when it is the larger.
				s.cpuRate = max(proc, float64(mBusy-s.mBusy)/float64(dTotal)*float64(mCores))
			}
			if s.cpuSamples == 0 {
				s.cpuLoad, s.procLoad = s.cpuRate, proc
			} else { // smooth one interval's noise, follow within a few
				s.cpuLoad = 0.5*s.cpuLoad + 0.5*s.cpuRate
				s.procLoad = 0.5*s.procLoad + 0.5*proc
			}
			s.cpuSamples++
		}
	}
	s.cpuAt, s.cpuLast, s.mBusy, s.mTotal = now, cpu, mBusy, mTotal
	for _, st := range s.streams {
		a := &st.adm
		busy := st.c.busy.Load()
		if !a.sampledAt.IsZero() {
			if dt := now.Sub(a.sampledAt); dt > 0 {
				rate := float64(busy-a.lastBusy) / float64(dt)
				if a.samples == 0 {
					a.load = rate
				} else {
					a.load = 0.5*a.load + 0.5*rate
				}
				if a.admitted {
					a.samples++
				}
			}
		}
		a.sampledAt, a.lastBusy = now, busy
	}
	v := s.loadLocked(nil)
	s.loadMeasured, s.loadPredicted, s.loadCost, s.loadCapacity = v.measured, v.predicted, v.cost, v.capacity
	// Shedding looks at the last interval alone (the smoothed load lags a
	// shed by a few intervals).
	last := s.cpuRate
	var shed []*stream
	downs, ups := s.simulcastStepsLocked(now, last, v, saturated)
	if last > v.capacity || len(saturated) > 0 {
		if s.overSince.IsZero() {
			s.overSince = now
			s.log.Warn("whip overload", "load_cores", last, "capacity_cores", v.capacity, "saturated_apps", saturated,
				"shed_after", s.cfg.ShedAfter)
		}
		// After ShedAfter over capacity, the newest streams go, as many
		// as the excess over the per-stream cost (at least one, never the
		// last: then the load is not the streams' doing); the next after
		// two intervals more (their clients have stopped, the load is
		// measured without them) if the load still does not fit.
		if s.cfg.ShedAfter >= 0 && now.Sub(s.overSince) >= s.cfg.ShedAfter && now.Sub(s.lastShed) >= 2*s.cfg.LoadInterval {
			var in []*stream
			for _, st := range s.streams {
				// On CPU overload every app's streams, on saturation the
				// saturated apps' streams.
				if st.adm.admitted && !st.adm.shed && (last > v.capacity || slices.Contains(saturated, st.app)) {
					in = append(in, st)
				}
			}
			slices.SortFunc(in, func(a, b *stream) int { return b.adm.admittedAt.Compare(a.adm.admittedAt) })
			k := 1 // saturation alone: one at a time, the outcome is measured again
			if last > v.capacity {
				k = max(1, int(math.Ceil((last-v.capacity)/v.cost)))
			}
			shed = in[:min(k, max(0, len(in)-1))]
			for _, st := range shed {
				st.adm.shed = true
				s.lastShed = now
			}
		}
	} else {
		s.overSince = time.Time{}
	}
	over := now.Sub(s.overSince)
	s.mu.Unlock()
	for _, d := range downs {
		d.st.sim.Load().step(-1, d.why)
	}
	for _, st := range ups {
		st.sim.Load().step(+1, fmt.Sprintf("room: CPU load %.2f cores of a capacity of %.2f for %v", last, v.capacity, stepUpAfter*s.cfg.LoadInterval))
	}
	for _, st := range shed {
		why := fmt.Sprintf("overload: CPU load %.2f cores above the capacity of %.2f for %v; the newest %d streams are ended to protect the others",
			last, v.capacity, over.Round(time.Second), len(shed))
		if last <= v.capacity {
			why = fmt.Sprintf("overload: the app's frames have reached it later than half its SLO for %v (CPU load %.2f of %.2f cores here; the machine or the network is short); the newest stream is ended to protect the others",
				over.Round(time.Second), last, v.capacity)
		}
		s.log.Warn(st.what()+" shed", "app", st.app, "stream", st.id, "load_cores", last, "capacity_cores", v.capacity, "shed", len(shed))
		go st.endAs(EndOverload, why)
	}
}

// Simulcast steps (simulcast.go): a stream whose decoding path is busy
// behindLoad of the wall time steps down a layer; so do simulcast streams,
// newest first, as many as shedding would end, while the load is above
// capacity or the app saturated, before any stream is shed (a step and a
// shed each wait two intervals after the last: the load is measured at the
// new layer). One stream steps back up (oldest first) after the load has
// stayed below stepUpShare of capacity for stepUpAfter intervals, if its
// own decoding would not fall behind at four times its pixels.
const (
	behindLoad  = 0.85
	stepUpShare = 0.5
	stepUpAfter = 5
)

type stepDown struct {
	st  *stream
	why string
}

// simulcastStepsLocked decides the simulcast streams to step down and up
// (s.mu held; the steps are taken after it is released: a stream's
// simulcast lock comes before the server's).
func (s *Server) simulcastStepsLocked(now time.Time, last float64, v loadView, saturated []dag.AppID) (downs []stepDown, ups []*stream) {
	var sims []*stream
	for _, st := range s.streams {
		if sim := st.sim.Load(); sim != nil && st.adm.admitted && !st.adm.shed {
			sims = append(sims, st)
		}
	}
	if len(sims) == 0 {
		return nil, nil
	}
	slices.SortFunc(sims, func(a, b *stream) int { return b.adm.admittedAt.Compare(a.adm.admittedAt) }) // newest first
	every := 2 * s.cfg.LoadInterval
	for _, st := range sims {
		a := &st.adm
		if a.samples >= 1 && a.load >= behindLoad && st.sim.Load().canDown.Load() && now.Sub(a.lastStep) >= every {
			a.lastStep = now
			downs = append(downs, stepDown{st, fmt.Sprintf("behind: its decoding takes %.0f%% of the wall time", 100*a.load)})
		}
	}
	over := last > v.capacity || len(saturated) > 0
	if over && now.Sub(s.lastShed) >= every {
		k := 1
		if last > v.capacity {
			k = max(1, int(math.Ceil((last-v.capacity)/v.cost)))
		}
		for _, st := range sims {
			if k == 0 {
				break
			}
			if !st.sim.Load().canDown.Load() || !(last > v.capacity || slices.Contains(saturated, st.app)) ||
				slices.ContainsFunc(downs, func(d stepDown) bool { return d.st == st }) {
				continue
			}
			why := fmt.Sprintf("overload: CPU load %.2f cores above the capacity of %.2f", last, v.capacity)
			if last <= v.capacity {
				why = "overload: the app's frames reach it later than half its SLO"
			}
			downs = append(downs, stepDown{st, why})
			k--
			s.lastShed = now // shedding waits: the load is measured at the new layers first
		}
	}
	if over || last > stepUpShare*v.capacity {
		s.roomSince = time.Time{}
		return downs, nil
	}
	if s.roomSince.IsZero() {
		s.roomSince = now
	}
	wait := stepUpAfter * s.cfg.LoadInterval
	if now.Sub(s.roomSince) < wait || now.Sub(s.lastShed) < wait {
		return downs, nil
	}
	for i := len(sims) - 1; i >= 0; i-- { // oldest first
		st := sims[i]
		if st.sim.Load().stepped.Load() > 0 && st.adm.load*4 < behindLoad {
			s.roomSince = now // the next one waits again
			return downs, []*stream{st}
		}
	}
	return downs, nil
}

// ingest.Admission returns the admission state.
func (s *Server) Admission() ingest.Admission {
	s.mu.Lock()
	a := ingest.Admission{MaxStreams: s.cfg.MaxStreams, MaxPending: s.cfg.MaxPending, LoadCores: s.loadMeasured, PredictedCores: s.loadPredicted,
		CapacityCores: s.cfg.CPUCores * s.cfg.CPUCeiling, StreamCost: s.loadCost, Refused: map[string]uint64{}, Ended: map[string]uint64{}}
	if a.StreamCost == 0 {
		a.StreamCost = s.cfg.StreamCost
	}
	a.Admitted, a.Pending = s.countsLocked()
	if !s.overSince.IsZero() {
		a.OverloadedFor = s.clk.Now().Sub(s.overSince)
	}
	for _, t := range s.totals {
		for k, n := range t.Ended {
			a.Ended[k] += n
		}
		for k, n := range t.Refused {
			a.Refused[k] += n
		}
	}
	live := make([]*stream, 0, len(s.streams)+len(s.delegated))
	for _, st := range s.streams {
		live = append(live, st)
	}
	for _, st := range s.delegated {
		live = append(live, st)
	}
	s.mu.Unlock()
	for _, st := range live { // info takes s.mu
		i := st.info()
		is := ingest.Stream{ID: i.ID, App: i.App, State: i.State, Codec: i.Codec, Source: i.Source, ReadBy: i.Worker,
			Width: i.Width, Height: i.Height, Waiting: i.Waiting, CameraLost: i.CameraLost, Layer: i.Layer, LayerDown: i.LayerDown}
		for _, l := range i.Layers {
			if l.Width > 0 {
				is.Layers = append(is.Layers, fmt.Sprintf("%s %dx%d", l.RID, l.Width, l.Height))
			} else {
				is.Layers = append(is.Layers, l.RID)
			}
		}
		a.Streams = append(a.Streams, is)
	}
	slices.SortFunc(a.Streams, func(x, y ingest.Stream) int { return strings.Compare(x.ID, y.ID) })
	if f := s.cameras.Load(); f != nil {
		a.Cameras = (*f)()
	}
	return a
}

// SetCameras adds the configured cameras' states to Admission (so status,
// GET /v1/ingest and the dashboard show a camera that has no stream: one
// that cannot be reached, refuses the password, or sends what cannot be
// decoded).
func (s *Server) SetCameras(f func() []ingest.Camera) { s.cameras.Store(&f) }

// MachineCPUTime reads the machine's busy and total CPU time over all its
// cores and their number from /proc/stat (zeros where it cannot).
func MachineCPUTime() (busy, total time.Duration, cores int) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		if f[0] != "cpu" {
			cores++
			continue
		}
		// user nice system idle iowait irq softirq steal (USER_HZ ticks).
		var v [8]int64
		for i := range min(len(v), len(f)-1) {
			v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
		}
		tick := 10 * time.Millisecond // USER_HZ = 100; only ratios are used
		busy = time.Duration(v[0]+v[1]+v[2]+v[5]+v[6]+v[7]) * tick
		total = busy + time.Duration(v[3]+v[4])*tick
	}
	return busy, total, cores
}

// machineCPU is MachineCPUTime when this process may use every core of the
// machine (no CPU quota, no CPUCores below the machine's): then what other
// processes take is taken from it. nil otherwise, and off Linux.
func machineCPU(cores float64) func() (time.Duration, time.Duration, int) {
	_, total, n := MachineCPUTime()
	if total == 0 || n != runtime.NumCPU() || float64(n) > cores {
		return nil
	}
	return MachineCPUTime
}

// ProcessCPUTime is this process's user and system CPU time (getrusage;
// 0 where it is unavailable, which makes the measured load 0).
func ProcessCPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
