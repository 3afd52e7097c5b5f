// Package wire converts between the worker's contract (worker.ModuleSpec,
// Task, Result) and media items and their gRPC messages (api/mdag.proto),
// and holds the transport's limits. Both sides use it: the coordinator's
// server (remote) and the worker and source clients (remote/client). It
// imports api, worker, media and dag only.
package wire

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

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
		if b.Keypoints != nil {
			out[i].Keypoints = make([]*api.Keypoint, len(b.Keypoints.Points))
			for j, k := range b.Keypoints.Points {
				out[i].Keypoints[j] = &api.Keypoint{X: k.X, Y: k.Y, Score: k.Score}
			}
		}
	}
	return out
}

// BoxFromPB is a box from the wire; its keypoints, if any, are carried
// as they are (Caps.CheckItem bounds their number first).
func BoxFromPB(b *api.Box) media.Box {
	out := media.Box{X: int(b.GetX()), Y: int(b.GetY()), W: int(b.GetW()), H: int(b.GetH()), Class: b.GetClass(), Score: b.GetScore()}
	if ks := b.GetKeypoints(); len(ks) > 0 {
		out.Keypoints = &media.Keypoints{Points: make([]media.Keypoint, len(ks))}
		for j, k := range ks {
			out.Keypoints.Points[j] = media.Keypoint{X: k.GetX(), Y: k.GetY(), Score: k.GetScore()}
		}
	}
	return out
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
	out := &api.Frame{Width: int32(f.W), Height: int32(f.H), Bgr: f.Pix}
	if f.Ref != nil {
		out.Bgr, out.Ref = nil, &api.FrameRef{Holder: f.Ref.Holder, Addr: f.Ref.Addr, Id: f.Ref.ID}
	}
	return out
}

// MaxRefField bounds a FrameRef's holder and address.
const MaxRefField = 256

// MaxThumbBytes bounds a worker's Thumbnail JPEG (a worker sends none
// larger, the coordinator refuses one).
const MaxThumbBytes = 64 << 10

// FrameFromPB checks the size: a frame from the wire is outside input. A
// reference (the direct data plane) has a size, a holder and an address
// and no pixels.
func FrameFromPB(f *api.Frame) (*media.Frame, error) {
	if f == nil {
		return nil, nil
	}
	if r := f.Ref; r != nil {
		if err := checkRef(f); err != nil {
			return nil, err
		}
		return &media.Frame{W: int(f.Width), H: int(f.Height), Ref: &media.FrameRef{Holder: r.Holder, Addr: r.Addr, ID: r.Id}}, nil
	}
	out := &media.Frame{W: int(f.Width), H: int(f.Height), Pix: f.Bgr}
	if err := out.Valid(); err != nil {
		return nil, err
	}
	return out, nil
}

// checkRef checks a frame reference's fields.
func checkRef(f *api.Frame) error {
	r := f.Ref
	switch {
	case f.Width <= 0 || f.Height <= 0:
		return fmt.Errorf("frame reference %dx%d: want a positive size", f.Width, f.Height)
	case len(f.Bgr) > 0:
		return fmt.Errorf("frame reference with %d bytes of pixels: a reference carries none", len(f.Bgr))
	case r.Holder == "" || r.Addr == "":
		return fmt.Errorf("frame reference %d: holder %q and address %q are both required", r.Id, r.Holder, r.Addr)
	case len(r.Holder) > MaxRefField || len(r.Addr) > MaxRefField:
		return fmt.Errorf("frame reference %d: holder or address longer than %d bytes", r.Id, MaxRefField)
	}
	return nil
}

// SourceFrameFromPB is FrameFromPB for a frame a source sends: pixels,
// never a reference (references are for workers' outputs), and present.
func SourceFrameFromPB(f *api.Frame) (*media.Frame, error) {
	if f.GetRef() != nil {
		return nil, errors.New("a frame reference: a source sends pixels (references are for workers' outputs)")
	}
	out, err := FrameFromPB(f)
	if err == nil && out == nil {
		err = errors.New("no frame")
	}
	return out, err
}

func ItemToPB(it *media.Item) *api.Item {
	out := &api.Item{Stream: it.Stream, Seq: it.Seq, CaptureUnixNs: UnixNS(it.Capture), DeadlineUnixNs: UnixNS(it.Deadline),
		Frame: FrameToPB(it.Frame), Boxes: BoxesToPB(it.Boxes), Truth: BoxesToPB(it.Truth), Labels: it.Labels,
		Tracks: TracksToPB(it.Tracks), Steps: StepsToPB(it.Steps), Events: EventsToPB(it.Events), Audio: AudioToPB(it.Audio)}
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

// ItemFromPB decodes an item; its frame and audio are checked (outside
// input), the rest is taken as it is (Caps.CheckItem bounds the counts).
func ItemFromPB(p *api.Item) (*media.Item, error) {
	f, err := FrameFromPB(p.Frame)
	if err != nil {
		return nil, fmt.Errorf("stream %s frame %d: %w", p.Stream, p.Seq, err)
	}
	a, err := AudioFromPB(p.Audio)
	if err != nil {
		return nil, fmt.Errorf("stream %s frame %d: %w", p.Stream, p.Seq, err)
	}
	it := &media.Item{Stream: p.Stream, Seq: p.Seq, Capture: FromNS(p.CaptureUnixNs), Deadline: FromNS(p.DeadlineUnixNs),
		Frame: f, Boxes: BoxesFromPB(p.Boxes), Truth: BoxesFromPB(p.Truth), Labels: p.Labels,
		Tracks: TracksFromPB(p.Tracks), Steps: StepsFromPB(p.Steps), Events: EventsFromPB(p.Events), Audio: a}
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

func TracksToPB(ts []media.Track) []*api.Track {
	if len(ts) == 0 {
		return nil
	}
	out := make([]*api.Track, len(ts))
	for i, t := range ts {
		out[i] = &api.Track{Id: t.ID, Box: BoxesToPB([]media.Box{t.Box})[0], Age: int32(t.Age), Hits: int32(t.Hits), Missed: int32(t.Missed)}
	}
	return out
}

// TracksFromPB decodes tracks; a track without a box has the zero box.
func TracksFromPB(ts []*api.Track) []media.Track {
	if len(ts) == 0 {
		return nil
	}
	out := make([]media.Track, len(ts))
	for i, t := range ts {
		out[i] = media.Track{ID: t.GetId(), Box: BoxFromPB(t.GetBox()), Age: int(t.GetAge()), Hits: int(t.GetHits()), Missed: int(t.GetMissed())}
	}
	return out
}

func StepsToPB(ss []media.Step) []*api.Step {
	if len(ss) == 0 {
		return nil
	}
	out := make([]*api.Step, len(ss))
	for i, s := range ss {
		out[i] = &api.Step{Seq: s.Seq, Boxes: BoxesToPB(s.Boxes), Labels: s.Labels, Tracks: TracksToPB(s.Tracks)}
	}
	return out
}

func StepsFromPB(ss []*api.Step) []media.Step {
	if len(ss) == 0 {
		return nil
	}
	out := make([]media.Step, len(ss))
	for i, s := range ss {
		out[i] = media.Step{Seq: s.GetSeq(), Boxes: BoxesFromPB(s.GetBoxes()), Labels: s.GetLabels(), Tracks: TracksFromPB(s.GetTracks())}
	}
	return out
}

func EventsToPB(es []media.Event) []*api.Event {
	if len(es) == 0 {
		return nil
	}
	out := make([]*api.Event, len(es))
	for i, e := range es {
		out[i] = &api.Event{Kind: e.Kind, Rule: e.Rule, Track: e.Track, Detail: e.Detail}
	}
	return out
}

func EventsFromPB(es []*api.Event) []media.Event {
	if len(es) == 0 {
		return nil
	}
	out := make([]media.Event, len(es))
	for i, e := range es {
		out[i] = media.Event{Kind: e.GetKind(), Rule: e.GetRule(), Track: e.GetTrack(), Detail: e.GetDetail()}
	}
	return out
}

// AudioToPB encodes a chunk's samples as little-endian int16.
func AudioToPB(a *media.Audio) *api.Audio {
	if a == nil {
		return nil
	}
	pcm := make([]byte, 2*len(a.PCM))
	for i, v := range a.PCM {
		binary.LittleEndian.PutUint16(pcm[2*i:], uint16(v))
	}
	return &api.Audio{Rate: int32(a.Rate), Channels: int32(a.Channels), Pcm: pcm}
}

// AudioFromPB checks the chunk: whole samples (an even number of bytes)
// and a consistent shape (media.Audio.Valid). Nil is no audio and passes.
func AudioFromPB(p *api.Audio) (*media.Audio, error) {
	if p == nil {
		return nil, nil
	}
	if len(p.Pcm)%2 != 0 {
		return nil, fmt.Errorf("audio: %d bytes of PCM, want whole 16-bit samples (an even number)", len(p.Pcm))
	}
	a := &media.Audio{Rate: int(p.Rate), Channels: int(p.Channels), PCM: make([]int16, len(p.Pcm)/2)}
	for i := range a.PCM {
		a.PCM[i] = int16(binary.LittleEndian.Uint16(p.Pcm[2*i:]))
	}
	if err := a.Valid(); err != nil {
		return nil, err
	}
	return a, nil
}

// taskKindToPB maps every worker.TaskKind to its wire value; taskKindFromPB
// is its inverse.
var (
	taskKindToPB = map[worker.TaskKind]api.TaskKind{
		worker.Run:        api.TaskKind_TASK_RUN,
		worker.Export:     api.TaskKind_TASK_EXPORT,
		worker.Checkpoint: api.TaskKind_TASK_CHECKPOINT,
		worker.Import:     api.TaskKind_TASK_IMPORT,
	}
	taskKindFromPB = func() map[api.TaskKind]worker.TaskKind {
		m := make(map[api.TaskKind]worker.TaskKind, len(taskKindToPB))
		for k, p := range taskKindToPB {
			m[p] = k
		}
		return m
	}()
)

// MaxStateBytes bounds a state snapshot on the wire, both ways: modules'
// own bound on a snapshot (modules.EncodeState's envelope).
const MaxStateBytes = 16 << 20

// TaskToPB encodes t. A Kind that is not one of worker's constants goes
// out as its number, which the worker refuses (BadTask).
func TaskToPB(t worker.Task) *api.Task {
	out := &api.Task{Id: t.ID, App: string(t.App), Module: string(t.Module), EarliestUnixNs: UnixNS(t.Earliest), LatestUnixNs: UnixNS(t.Latest),
		Stream: t.Stream, State: t.State}
	k, ok := taskKindToPB[t.Kind]
	if !ok {
		k = api.TaskKind(t.Kind)
	}
	out.Kind = k
	out.Items = make([]*api.Item, len(t.Items))
	for i, it := range t.Items {
		out.Items[i] = ItemToPB(it)
	}
	return out
}

// TaskFromPB decodes a task from the coordinator. A kind this side does not
// know (a newer coordinator's), a state operation without a stream, state
// bytes on a task that is no import or over MaxStateBytes, and an item
// that does not decode are errors, which the worker answers with BadTask.
func TaskFromPB(p *api.Task) (worker.Task, error) {
	t := worker.Task{ID: p.Id, App: dag.AppID(p.App), Module: dag.ModuleID(p.Module), Earliest: FromNS(p.EarliestUnixNs), Latest: FromNS(p.LatestUnixNs),
		Stream: p.Stream}
	k, ok := taskKindFromPB[p.Kind]
	switch {
	case !ok:
		return t, fmt.Errorf("task %d for %s/%s: unknown task kind %d on the wire (known: run, export, checkpoint, import)", p.Id, p.App, p.Module, int32(p.Kind))
	case k != worker.Run && p.Stream == "":
		return t, fmt.Errorf("task %d for %s/%s: a %s task names no stream", p.Id, p.App, p.Module, k)
	case len(p.State) > MaxStateBytes:
		return t, fmt.Errorf("task %d for %s/%s: %d bytes of state, more than the %d allowed", p.Id, p.App, p.Module, len(p.State), MaxStateBytes)
	case len(p.State) > 0 && k != worker.Import:
		return t, fmt.Errorf("task %d for %s/%s: a %s task carries state (only import does)", p.Id, p.App, p.Module, k)
	}
	t.Kind = k
	if len(p.State) > 0 {
		t.State = p.State
	}
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
		worker.PeerLost:      api.Outcome_OUTCOME_PEER_LOST,
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
	if r.Outcome == worker.Done {
		out.State = r.State
	}
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
// peer's, or none at all), an output it cannot decode or state over
// MaxStateBytes turns the result into BadResult, so its frames are still
// accounted. State travels with a Done result only.
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
	if len(p.State) > MaxStateBytes {
		return worker.Result{Task: p.Task, Outcome: worker.BadResult, Detail: fmt.Sprintf("task %d: %d bytes of state, more than the %d allowed", p.Task, len(p.State), MaxStateBytes), Measured: r.Measured}
	}
	if len(p.State) > 0 {
		r.State = p.State
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

// MaxKeypoints bounds the keypoints of one box from the wire (COCO
// WholeBody has 133): a box with more is refused, like a frame with too
// many boxes.
const MaxKeypoints = 256

// ErrKeypoints is a box with more than MaxKeypoints.
var ErrKeypoints = errors.New("too many keypoints")

// CheckKeypoints refuses a box with more than MaxKeypoints.
func CheckKeypoints(bs []*api.Box) error {
	for i, b := range bs {
		if n := len(b.GetKeypoints()); n > MaxKeypoints {
			return fmt.Errorf("%w: box %d has %d, the limit is %d", ErrKeypoints, i, n, MaxKeypoints)
		}
	}
	return nil
}

// MaxBoxBytes bounds one box's encoding with a class name of up to 64
// bytes; it sizes the headroom a message gets for its boxes.
const MaxBoxBytes = 96

// Defaults for the caps on what items carry besides frames and boxes
// (remote.Limits takes them where its fields are zero).
const (
	DefaultTracks = 1024    // tracks on one item, and on one step of it
	DefaultSteps  = 256     // steps one item carries (a window's items, a sequence's context)
	DefaultEvents = 1024    // events on one item
	DefaultLabels = 1024    // labels on one item, and on one step of it
	MaxAudioBytes = 4 << 20 // PCM bytes of one audio chunk: ~21 s of 48 kHz stereo
)

// Caps are the coordinator's limits on what a peer sends (remote.Limits):
// a frame's declared width and height, boxes per frame, items per result;
// tracks, steps, events and labels per item (tracks, boxes and labels per
// step too), an audio chunk's PCM bytes, and a result's state bytes.
// Checks run on the decoded message before anything is built from it;
// each error says what and the limit.
type Caps struct {
	FrameW, FrameH int
	Boxes          int
	ResultItems    int
	Tracks         int
	Steps          int
	Events         int
	Labels         int
	AudioBytes     int
	StateBytes     int
}

// ErrFrameSize, ErrBoxes, ErrResultItems, ErrTracks, ErrSteps, ErrEvents,
// ErrLabels, ErrAudioSize and ErrStateSize tell which cap a message broke
// (errors.Is).
var (
	ErrFrameSize   = errors.New("frame over the size limit")
	ErrBoxes       = errors.New("too many boxes")
	ErrResultItems = errors.New("too many items in a result")
	ErrTracks      = errors.New("too many tracks")
	ErrSteps       = errors.New("too many steps")
	ErrEvents      = errors.New("too many events")
	ErrLabels      = errors.New("too many labels")
	ErrAudioSize   = errors.New("audio chunk over the size limit")
	ErrStateSize   = errors.New("state snapshot over the size limit")
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
	if f.Ref != nil {
		return checkRef(f)
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

// CheckItem checks one item: its frame, boxes and ground truth, labels,
// tracks, events, steps (each step's boxes, labels and tracks) and audio.
func (c Caps) CheckItem(p *api.Item) error {
	if err := c.CheckFrame(p.GetFrame()); err != nil {
		return err
	}
	if err := c.CheckBoxes("boxes", len(p.GetBoxes())); err != nil {
		return err
	}
	if err := c.CheckBoxes("ground-truth boxes", len(p.GetTruth())); err != nil {
		return err
	}
	if err := CheckKeypoints(p.GetBoxes()); err != nil {
		return err
	}
	if err := CheckKeypoints(p.GetTruth()); err != nil {
		return err
	}
	if err := c.checkResults("", p.GetLabels(), p.GetTracks()); err != nil {
		return err
	}
	if n := len(p.GetEvents()); n > c.Events {
		return fmt.Errorf("%w: %d events on one item, the limit is %d", ErrEvents, n, c.Events)
	}
	if n := len(p.GetSteps()); n > c.Steps {
		return fmt.Errorf("%w: %d steps on one item, the limit is %d", ErrSteps, n, c.Steps)
	}
	for i, st := range p.GetSteps() {
		where := fmt.Sprintf(" on step %d (seq %d)", i, st.GetSeq())
		if n := len(st.GetBoxes()); n > c.Boxes {
			return fmt.Errorf("%w: %d boxes%s, the limit is %d", ErrBoxes, n, where, c.Boxes)
		}
		if err := c.checkResults(where, st.GetLabels(), st.GetTracks()); err != nil {
			return err
		}
	}
	return c.CheckAudio(p.GetAudio())
}

// checkResults checks the labels and tracks of an item or a step (where).
func (c Caps) checkResults(where string, labels []string, tracks []*api.Track) error {
	if where == "" {
		where = " on one item"
	}
	if n := len(labels); n > c.Labels {
		return fmt.Errorf("%w: %d labels%s, the limit is %d", ErrLabels, n, where, c.Labels)
	}
	if n := len(tracks); n > c.Tracks {
		return fmt.Errorf("%w: %d tracks%s, the limit is %d", ErrTracks, n, where, c.Tracks)
	}
	return nil
}

// CheckAudio checks a chunk's PCM bytes against the cap, and that they are
// whole 16-bit samples, before a media.Audio is made of it. A nil a is no
// audio and passes.
func (c Caps) CheckAudio(a *api.Audio) error {
	if a == nil {
		return nil
	}
	if n := len(a.Pcm); n > c.AudioBytes {
		return fmt.Errorf("%w: %d bytes of PCM, the limit is %d", ErrAudioSize, n, c.AudioBytes)
	}
	if len(a.Pcm)%2 != 0 {
		return fmt.Errorf("audio: %d bytes of PCM, want whole 16-bit samples (an even number)", len(a.Pcm))
	}
	return nil
}

// CheckState checks a snapshot's size (a worker's export or checkpoint).
func (c Caps) CheckState(task uint64, state []byte) error {
	if n := len(state); n > c.StateBytes {
		return fmt.Errorf("%w: task %d has %d bytes of state, the limit is %d", ErrStateSize, task, n, c.StateBytes)
	}
	return nil
}

// CheckResult checks a worker's result: its state's size, the number of
// output items, all outputs together, then each item.
func (c Caps) CheckResult(p *api.Result) error {
	if err := c.CheckState(p.GetTask(), p.GetState()); err != nil {
		return err
	}
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

// Batches (issue 41): a sender that finds several messages queued sends
// them as one WorkerBatch or CoordinatorBatch, in order, so that under load
// a worker's stream carries a few large messages instead of many small
// ones (gRPC's cost is mostly per message: framing, flushes, syscalls).
const (
	// MaxBatch bounds the messages of one batch; a receiver refuses more.
	MaxBatch = 1024
	// MaxBatchBytes is about the most a batch carries: the message that
	// would take it past goes in the next one (a single larger message
	// goes alone). 1 MiB takes half a second at 16 Mbit/s, well inside a
	// worker's heartbeat grace.
	MaxBatchBytes = 1 << 20
)

// Gather returns first and the messages queued on ch behind it, while
// batchable takes them, up to MaxBatch and MaxBatchBytes; it never waits.
// The first message it stops at (not batchable, or over the bytes) comes
// back as next, to be sent after the batch. Nothing is sized when nothing
// is queued.
func Gather[M proto.Message](first M, ch <-chan M, batchable func(M) bool) (batch []M, next M, hasNext bool) {
	batch = append(batch, first)
	size := -1 // first's, once a second message comes
	for len(batch) < MaxBatch {
		select {
		case m := <-ch:
			if !batchable(m) {
				return batch, m, true
			}
			if size < 0 {
				size = proto.Size(first) + 8
			}
			n := proto.Size(m) + 8 // its tag and length in the batch
			if size+n > MaxBatchBytes {
				return batch, m, true
			}
			size += n
			batch = append(batch, m)
		default:
			return batch, next, false
		}
	}
	return batch, next, false
}

// PackUp is what a worker sends for first and what queued behind it on
// ch: first alone, or one WorkerBatch of it and those Gather takes; next
// is the message Gather stopped at (nil: none), to be sent after it.
func PackUp(first *api.WorkerMessage, ch <-chan *api.WorkerMessage) (m, next *api.WorkerMessage) {
	return pack(first, ch, batchableUp, func(b []*api.WorkerMessage) *api.WorkerMessage {
		return &api.WorkerMessage{Msg: &api.WorkerMessage_Batch{Batch: &api.WorkerBatch{Msgs: b}}}
	})
}

// PackDown is PackUp for the coordinator's messages to a worker.
func PackDown(first *api.CoordinatorMessage, ch <-chan *api.CoordinatorMessage) (m, next *api.CoordinatorMessage) {
	return pack(first, ch, batchableDown, func(b []*api.CoordinatorMessage) *api.CoordinatorMessage {
		return &api.CoordinatorMessage{Msg: &api.CoordinatorMessage_Batch{Batch: &api.CoordinatorBatch{Msgs: b}}}
	})
}

func pack[M proto.Message](first M, ch <-chan M, batchable func(M) bool, wrap func([]M) M) (m, next M) {
	if !batchable(first) {
		return first, next
	}
	batch, next, _ := Gather(first, ch, batchable)
	if len(batch) == 1 {
		return first, next
	}
	return wrap(batch), next
}

// batchableUp says whether m may go in a WorkerBatch: not a register or
// a batch.
func batchableUp(m *api.WorkerMessage) bool {
	switch m.Msg.(type) {
	case *api.WorkerMessage_Register, *api.WorkerMessage_Batch:
		return false
	}
	return true
}

// batchableDown says whether m may go in a CoordinatorBatch: not a
// registered or a batch.
func batchableDown(m *api.CoordinatorMessage) bool {
	switch m.Msg.(type) {
	case *api.CoordinatorMessage_Registered, *api.CoordinatorMessage_Batch:
		return false
	}
	return true
}
