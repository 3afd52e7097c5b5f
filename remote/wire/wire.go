// Package wire converts between the worker's contract (worker.ModuleSpec,
// Task, Result) and media items and their gRPC messages (api/mdag.proto),
// and holds the transport's limits. Both sides use it: the coordinator's
// server (remote) and the worker and source clients (remote/client). It
// imports api, worker, media and dag only.
package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/worker"
)

// Conversions between the engine's types and the wire's. Times travel as
// Unix nanoseconds (0 = unset): processes on one machine share a clock, and
// on several machines mdag assumes NTP-synchronised clocks (action windows
// are tens of milliseconds; NTP keeps hosts within about a millisecond).

func UnixNS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func FromNS(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

func SpecToPB(s worker.ModuleSpec) (*api.ModuleSpec, error) {
	out := &api.ModuleSpec{App: string(s.App), Module: string(s.Module), Kind: string(s.Kind), Op: s.Op, Model: s.Model, Concurrency: int32(s.Concurrency)}
	if len(s.Params) > 0 {
		b, err := json.Marshal(s.Params)
		if err != nil {
			return nil, fmt.Errorf("module %s/%s params: %w", s.App, s.Module, err)
		}
		out.ParamsJson = b
	}
	for _, l := range s.Latency {
		out.LatencyNs = append(out.LatencyNs, int64(l))
	}
	return out, nil
}

func SpecFromPB(p *api.ModuleSpec) (worker.ModuleSpec, error) {
	s := worker.ModuleSpec{App: dag.AppID(p.App), Module: dag.ModuleID(p.Module), Kind: dag.Kind(p.Kind), Op: p.Op, Model: p.Model, Concurrency: int(p.Concurrency)}
	if len(p.ParamsJson) > 0 {
		if err := json.Unmarshal(p.ParamsJson, &s.Params); err != nil {
			return s, fmt.Errorf("module %s/%s params: %w", p.App, p.Module, err)
		}
	}
	for _, l := range p.LatencyNs {
		s.Latency = append(s.Latency, time.Duration(l))
	}
	return s, nil
}

func BoxesToPB(bs []media.Box) []*api.Box {
	if len(bs) == 0 {
		return nil
	}
	out := make([]*api.Box, len(bs))
	for i, b := range bs {
		out[i] = &api.Box{X: int32(b.X), Y: int32(b.Y), W: int32(b.W), H: int32(b.H), Class: b.Class, Score: b.Score}
	}
	return out
}

func BoxFromPB(b *api.Box) media.Box {
	return media.Box{X: int(b.GetX()), Y: int(b.GetY()), W: int(b.GetW()), H: int(b.GetH()), Class: b.GetClass(), Score: b.GetScore()}
}

func BoxesFromPB(bs []*api.Box) []media.Box {
	if len(bs) == 0 {
		return nil
	}
	out := make([]media.Box, len(bs))
	for i, b := range bs {
		out[i] = BoxFromPB(b)
	}
	return out
}

func FrameToPB(f *media.Frame) *api.Frame {
	if f == nil {
		return nil
	}
	return &api.Frame{Width: int32(f.W), Height: int32(f.H), Bgr: f.Pix}
}

// FrameFromPB checks the size: a frame from the wire is outside input.
func FrameFromPB(f *api.Frame) (*media.Frame, error) {
	if f == nil {
		return nil, nil
	}
	out := &media.Frame{W: int(f.Width), H: int(f.Height), Pix: f.Bgr}
	if err := out.Valid(); err != nil {
		return nil, err
	}
	return out, nil
}

func ItemToPB(it *media.Item) *api.Item {
	out := &api.Item{Stream: it.Stream, Seq: it.Seq, CaptureUnixNs: UnixNS(it.Capture), DeadlineUnixNs: UnixNS(it.Deadline),
		Frame: FrameToPB(it.Frame), Boxes: BoxesToPB(it.Boxes), Truth: BoxesToPB(it.Truth), Labels: it.Labels}
	if it.Region != nil {
		out.Region = BoxesToPB([]media.Box{*it.Region})[0]
	}
	if len(it.Counts) > 0 {
		out.Counts = make(map[string]int64, len(it.Counts))
		for k, v := range it.Counts {
			out.Counts[k] = int64(v)
		}
	}
	return out
}

func ItemFromPB(p *api.Item) (*media.Item, error) {
	f, err := FrameFromPB(p.Frame)
	if err != nil {
		return nil, fmt.Errorf("stream %s frame %d: %w", p.Stream, p.Seq, err)
	}
	it := &media.Item{Stream: p.Stream, Seq: p.Seq, Capture: FromNS(p.CaptureUnixNs), Deadline: FromNS(p.DeadlineUnixNs),
		Frame: f, Boxes: BoxesFromPB(p.Boxes), Truth: BoxesFromPB(p.Truth), Labels: p.Labels}
	if p.Region != nil {
		r := BoxFromPB(p.Region)
		it.Region = &r
	}
	if len(p.Counts) > 0 {
		it.Counts = make(map[string]int, len(p.Counts))
		for k, v := range p.Counts {
			it.Counts[k] = int(v)
		}
	}
	return it, nil
}

func TaskToPB(t worker.Task) *api.Task {
	out := &api.Task{Id: t.ID, App: string(t.App), Module: string(t.Module), EarliestUnixNs: UnixNS(t.Earliest), LatestUnixNs: UnixNS(t.Latest)}
	out.Items = make([]*api.Item, len(t.Items))
	for i, it := range t.Items {
		out.Items[i] = ItemToPB(it)
	}
	return out
}

func TaskFromPB(p *api.Task) (worker.Task, error) {
	t := worker.Task{ID: p.Id, App: dag.AppID(p.App), Module: dag.ModuleID(p.Module), Earliest: FromNS(p.EarliestUnixNs), Latest: FromNS(p.LatestUnixNs)}
	t.Items = make([]*media.Item, len(p.Items))
	for i, pi := range p.Items {
		it, err := ItemFromPB(pi)
		if err != nil {
			return t, err
		}
		t.Items[i] = it
	}
	return t, nil
}

// outcomeToPB maps every worker.Outcome to its wire value; outcomeFromPB
// is its inverse.
var (
	outcomeToPB = map[worker.Outcome]api.Outcome{
		worker.Done:          api.Outcome_OUTCOME_OK,
		worker.Rejected:      api.Outcome_OUTCOME_REJECTED,
		worker.QueueFull:     api.Outcome_OUTCOME_QUEUE_FULL,
		worker.NotLoaded:     api.Outcome_OUTCOME_MODULE_NOT_LOADED,
		worker.Unloaded:      api.Outcome_OUTCOME_UNLOADED,
		worker.ModuleError:   api.Outcome_OUTCOME_MODULE_ERROR,
		worker.ExecutorError: api.Outcome_OUTCOME_EXECUTOR,
		worker.BadResult:     api.Outcome_OUTCOME_BAD_RESULT,
		worker.BadTask:       api.Outcome_OUTCOME_BAD_TASK,
	}
	outcomeFromPB = func() map[api.Outcome]worker.Outcome {
		m := make(map[api.Outcome]worker.Outcome, len(outcomeToPB))
		for o, p := range outcomeToPB {
			m[p] = o
		}
		return m
	}()
)

// ResultToPB encodes r; outputs travel only with a Done result. An Outcome
// that is not one of worker's constants goes out as OUTCOME_BAD_RESULT
// with a detail naming it.
func ResultToPB(r worker.Result) *api.Result {
	out := &api.Result{Task: r.Task, Detail: r.Detail, MeasuredNs: int64(r.Measured)}
	po, ok := outcomeToPB[r.Outcome]
	if !ok {
		po, out.Detail = api.Outcome_OUTCOME_BAD_RESULT, withDetail(fmt.Sprintf("task %d: the worker produced unknown outcome %d", r.Task, uint8(r.Outcome)), r.Detail)
	}
	out.Outcome = po
	if r.Outcome != worker.Done {
		return out
	}
	out.Outputs = make([]*api.ItemList, len(r.Outputs))
	for i, l := range r.Outputs {
		pl := &api.ItemList{Items: make([]*api.Item, len(l))}
		for j, it := range l {
			pl.Items[j] = ItemToPB(it)
		}
		out.Outputs[i] = pl
	}
	return out
}

// ResultFromPB never fails: an outcome this side does not know (a newer
// peer's, or none at all) or an output it cannot decode turns the result
// into BadResult, so its frames are still accounted.
func ResultFromPB(p *api.Result) worker.Result {
	r := worker.Result{Task: p.Task, Detail: p.Detail, Measured: time.Duration(p.MeasuredNs)}
	o, ok := outcomeFromPB[p.Outcome]
	if !ok {
		what := fmt.Sprintf("task %d: unknown outcome %d on the wire", p.Task, int32(p.Outcome))
		if p.Outcome == api.Outcome_OUTCOME_UNSPECIFIED {
			what = fmt.Sprintf("task %d: no outcome on the wire (OUTCOME_UNSPECIFIED)", p.Task)
		}
		r.Outcome, r.Detail = worker.BadResult, withDetail(what, p.Detail)
		return r
	}
	r.Outcome = o
	if o != worker.Done {
		return r
	}
	r.Outputs = make([][]*media.Item, len(p.Outputs))
	for i, l := range p.Outputs {
		for _, pi := range l.GetItems() {
			it, err := ItemFromPB(pi)
			if err != nil {
				return worker.Result{Task: p.Task, Outcome: worker.BadResult, Detail: fmt.Sprintf("output %d: %v", i, err), Measured: r.Measured}
			}
			r.Outputs[i] = append(r.Outputs[i], it)
		}
	}
	return r
}

// withDetail appends the peer's own detail, if any, to what went wrong.
func withDetail(what, detail string) string {
	if detail == "" {
		return what
	}
	return what + " (detail: " + detail + ")"
}

// MaxMessage is the largest gRPC message either side accepts: a batch of
// full-HD BGR frames is tens of megabytes.
const MaxMessage = 256 << 20

// Defaults for Server.
const (
	DefaultHeartbeat = 500 * time.Millisecond
	DefaultSendQueue = 4096 // messages waiting for one worker's stream
)

// MaxBoxBytes bounds one box's encoding with a class name of up to 64
// bytes; it sizes the headroom a message gets for its boxes.
const MaxBoxBytes = 96

// Caps are the coordinator's limits on what a peer sends (remote.Limits):
// a frame's declared width and height, boxes per frame, and items per
// result. Checks run on the decoded message before anything is built from
// it; each error says what and the limit.
type Caps struct {
	FrameW, FrameH int
	Boxes          int
	ResultItems    int
}

// ErrFrameSize, ErrBoxes and ErrResultItems tell which cap a message broke
// (errors.Is).
var (
	ErrFrameSize   = errors.New("frame over the size limit")
	ErrBoxes       = errors.New("too many boxes")
	ErrResultItems = errors.New("too many items in a result")
)

// CheckFrame checks f's declared size against the caps, and its payload
// against width*height*3, before a media.Frame is made of it. A nil f is
// no frame and passes.
func (c Caps) CheckFrame(f *api.Frame) error {
	if f == nil {
		return nil
	}
	w, h := int64(f.Width), int64(f.Height)
	if w > int64(c.FrameW) || h > int64(c.FrameH) {
		return fmt.Errorf("%w: %dx%d is larger than %dx%d (--max-frame)", ErrFrameSize, w, h, c.FrameW, c.FrameH)
	}
	if w <= 0 || h <= 0 || int64(len(f.Bgr)) != w*h*3 {
		return fmt.Errorf("frame %dx%d has %d bytes, want %d", w, h, len(f.Bgr), max(0, w*h*3))
	}
	return nil
}

// CheckBoxes checks one frame's boxes (detections, or ground truth).
func (c Caps) CheckBoxes(what string, n int) error {
	if n > c.Boxes {
		return fmt.Errorf("%w: %d %s on one frame, the limit is %d", ErrBoxes, n, what, c.Boxes)
	}
	return nil
}

// CheckItem checks one item: its frame, boxes and ground truth.
func (c Caps) CheckItem(p *api.Item) error {
	if err := c.CheckFrame(p.GetFrame()); err != nil {
		return err
	}
	if err := c.CheckBoxes("boxes", len(p.GetBoxes())); err != nil {
		return err
	}
	return c.CheckBoxes("ground-truth boxes", len(p.GetTruth()))
}

// CheckResult checks a worker's result: the number of output items, all
// outputs together, then each item.
func (c Caps) CheckResult(p *api.Result) error {
	n := 0
	for _, l := range p.GetOutputs() {
		n += len(l.GetItems())
	}
	if n > c.ResultItems {
		return fmt.Errorf("%w: task %d has %d output items, the limit is %d", ErrResultItems, p.GetTask(), n, c.ResultItems)
	}
	for i, l := range p.GetOutputs() {
		for j, it := range l.GetItems() {
			if err := c.CheckItem(it); err != nil {
				return fmt.Errorf("task %d output %d item %d: %w", p.GetTask(), i, j, err)
			}
		}
	}
	return nil
}
