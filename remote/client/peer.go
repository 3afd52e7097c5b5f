package client

import (
	"container/heap"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/defaults"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/remote/wire"
)

// The direct data plane (issue 25). A worker with a peer address keeps the
// frames its modules make in a Store and sends the coordinator references
// (media.FrameRef) instead of pixels; the worker that runs the next module
// fetches them from the holder's Peer service. The coordinator routes,
// schedules and accounts, but frame bytes go worker to worker, once, or not
// at all when the next module runs on the same worker.

// Store defaults.
const (
	// DefaultStoreBytes bounds the pixels one worker holds for others.
	DefaultStoreBytes = 1 << 30
	// DefaultHoldAfter is how long a frame stays after its item's
	// deadline: a late frame's next module may still fetch it.
	DefaultHoldAfter = 2 * time.Second
	// MaxFetchIDs bounds the frames one Fetch asks for.
	MaxFetchIDs = 4096
	// DefaultInlineBelow: frames of fewer pixel bytes (crops) travel
	// inline in results, as on the relay: carrying a few KiB through the
	// coordinator costs less than a fetch (a round trip to the holder).
	DefaultInlineBelow = 32 << 10
)

// Store holds the frames a worker made until their items' deadlines (plus
// HoldAfter) pass, up to MaxBytes: past it the frame due to expire first is
// evicted. A fetch of a frame no longer held fails NOT_FOUND, and the
// fetching worker reports the task peer-lost: the frame is accounted as
// dropped, never lost silently. Safe for concurrent use.
type Store struct {
	Clock     clock.Clock   // nil: real time
	MaxBytes  int64         // 0: DefaultStoreBytes
	HoldAfter time.Duration // 0: DefaultHoldAfter

	mu     sync.Mutex
	next   uint64
	frames map[uint64]*held
	due    heldHeap
	bytes  int64
	stats  StoreStats
}

// StoreStats counts what a Store did.
type StoreStats struct {
	Held    int    // frames held now
	Bytes   int64  // their pixels
	Put     uint64 // frames stored
	Served  uint64 // frames fetched by other workers
	Local   uint64 // frames taken by this worker's own next module (no transfer)
	Expired uint64 // dropped past their deadline and HoldAfter
	Evicted uint64 // dropped early to stay under MaxBytes
	Missing uint64 // asked for and not held
}

type held struct {
	id     uint64
	f      *media.Frame
	expiry time.Time
	index  int
}

type heldHeap []*held

func (h heldHeap) Len() int { return len(h) }
func (h heldHeap) Less(i, j int) bool {
	if !h[i].expiry.Equal(h[j].expiry) {
		return h[i].expiry.Before(h[j].expiry)
	}
	return h[i].id < h[j].id
}
func (h heldHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].index = i; h[j].index = j }
func (h *heldHeap) Push(x any)   { e := x.(*held); e.index = len(*h); *h = append(*h, e) }
func (h *heldHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil // the frame may go
	*h = old[:len(old)-1]
	return e
}

// check reports s's fields out of range (negative), by name; zero ones
// take their defaults at first use.
func (s *Store) check(c *defaults.Fields, prefix string) {
	if s.MaxBytes < 0 {
		c.Bad(prefix+"MaxBytes", s.MaxBytes, fmt.Sprintf("must be >= 0 (0: the default %d)", DefaultStoreBytes))
	}
	if s.HoldAfter < 0 {
		c.Bad(prefix+"HoldAfter", s.HoldAfter, "must be >= 0 (0: the default "+DefaultHoldAfter.String()+")")
	}
}

func (s *Store) init() {
	if s.frames == nil {
		s.frames = map[uint64]*held{}
		if s.Clock == nil {
			s.Clock = clock.Real{}
		}
		if s.MaxBytes <= 0 {
			s.MaxBytes = DefaultStoreBytes
		}
		if s.HoldAfter <= 0 {
			s.HoldAfter = DefaultHoldAfter
		}
	}
}

// Put holds f until deadline plus HoldAfter and returns its key: a random
// 64-bit number, so a worker restarted under the same ID and address
// answers an old key NOT_FOUND instead of another frame, and a peer cannot
// guess the keys of frames it was not routed. ok is false when f itself
// would not fit under MaxBytes (it is larger, or due before everything
// else held): then it is not held, and the caller sends it inline.
func (s *Store) Put(f *media.Frame, deadline time.Time) (id uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init()
	s.expire()
	e := &held{f: f, expiry: deadline.Add(s.HoldAfter)}
	size := int64(len(f.Pix))
	if size > s.MaxBytes {
		return 0, false
	}
	for s.bytes+size > s.MaxBytes {
		if len(s.due) == 0 || s.due[0].expiry.After(e.expiry) {
			return 0, false // everything held is due after f
		}
		s.remove(heap.Pop(&s.due).(*held))
		s.stats.Evicted++
	}
	for e.id == 0 || s.frames[e.id] != nil {
		e.id = frameKey()
	}
	s.frames[e.id] = e
	heap.Push(&s.due, e)
	s.bytes += size
	s.stats.Put++
	return e.id, true
}

// frameKey is a new frame's key: 64 bits from crypto/rand, the only thing
// between a worker holding a peer certificate and the frames it was not
// routed (math/rand's generators are predictable from their outputs).
func frameKey() uint64 {
	var b [8]byte
	_, _ = crand.Read(b[:]) // never fails (Go 1.24+: it crashes the program rather than return an error)
	return binary.LittleEndian.Uint64(b[:])
}

// Get returns the frame held under id; local says whether this worker's
// own module takes it (counted apart from fetches by peers).
func (s *Store) Get(id uint64, local bool) (*media.Frame, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init()
	s.expire()
	e := s.frames[id]
	if e == nil {
		s.stats.Missing++
		return nil, false
	}
	if local {
		s.stats.Local++
	} else {
		s.stats.Served++
	}
	return e.f, true
}

// Stats returns the counters.
func (s *Store) Stats() StoreStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.init()
	s.expire()
	st := s.stats
	st.Held, st.Bytes = len(s.frames), s.bytes
	return st
}

// expire drops the frames past their expiry; s.mu is held.
func (s *Store) expire() {
	now := s.Clock.Now()
	for len(s.due) > 0 && !s.due[0].expiry.After(now) {
		s.remove(heap.Pop(&s.due).(*held))
		s.stats.Expired++
	}
}

func (s *Store) remove(e *held) {
	delete(s.frames, e.id)
	s.bytes -= int64(len(e.f.Pix))
}

// PeerServer is a worker's Peer service: other workers fetch the frames
// its Store holds. Register it on a gRPC server with NewPeerGRPC (or
// api.RegisterPeerServer) and serve it on the worker's peer address.
type PeerServer struct {
	api.UnimplementedPeerServer
	ID    string // the worker's instance ID: a Fetch for another holder is refused
	Store *Store
}

// Fetch implements api.PeerServer.
func (p *PeerServer) Fetch(req *api.FetchRequest, stream grpc.ServerStreamingServer[api.FetchedFrame]) error {
	if req.Holder != p.ID {
		return status.Errorf(codes.FailedPrecondition, "this is worker %q, not %q: the frames are not here", p.ID, req.Holder)
	}
	if n := len(req.Ids); n == 0 || n > MaxFetchIDs {
		return status.Errorf(codes.InvalidArgument, "fetch %d frames: want 1 to %d", n, MaxFetchIDs)
	}
	seen := make(map[uint64]struct{}, len(req.Ids))
	for _, id := range req.Ids {
		if _, dup := seen[id]; dup {
			// one frame sent 4096 times would cost 4096 copies for one key
			return status.Errorf(codes.InvalidArgument, "frame %d is asked for twice in one fetch", id)
		}
		seen[id] = struct{}{}
	}
	for _, id := range req.Ids {
		f, ok := p.Store.Get(id, false)
		if !ok {
			return status.Errorf(codes.NotFound, "frame %d is not held by worker %s (past its deadline, or evicted to stay under the store's limit)", id, p.ID)
		}
		if err := stream.Send(&api.FetchedFrame{Id: id, Frame: wire.FrameToPB(f)}); err != nil {
			return err
		}
	}
	return nil
}

// MaxPeerStreams caps the Fetch streams open at once on one connection to
// a worker's peer port (grpc.MaxConcurrentStreams): a fetching worker's
// streams beyond it wait for one to end, and no connection can open an
// unbounded number of them.
const MaxPeerStreams = 256

// NewPeerGRPC returns a gRPC server with p registered and mdag's message
// limits; opts add credentials (mutual TLS: pki.Material.PeerServerConfig).
//
// A connection must finish its TLS handshake within 10 s and may have at
// most MaxPeerStreams streams open.
func NewPeerGRPC(p *PeerServer, opts ...grpc.ServerOption) *grpc.Server {
	g := grpc.NewServer(append([]grpc.ServerOption{grpc.MaxRecvMsgSize(1 << 20), grpc.MaxSendMsgSize(wire.MaxMessage), grpc.ConnectionTimeout(10 * time.Second),
		grpc.MaxConcurrentStreams(MaxPeerStreams), KeepaliveEnforcement()}, opts...)...)
	api.RegisterPeerServer(g, p)
	return g
}

// DataPlane is a worker's side of the direct data plane.
type DataPlane struct {
	// Addr is where this worker's Peer service is reachable (host:port),
	// told to the coordinator at registration; empty: none, and this
	// worker's outputs travel through the coordinator (it still fetches
	// the frames other workers hold).
	Addr string
	// Store holds the frames this worker made (Addr set); nil: a Store
	// with defaults.
	Store *Store
	// Dial reaches another worker's Peer service; nil: plaintext (Dial).
	Dial func(addr string) (*grpc.ClientConn, error)
	// FetchTimeout bounds one fetch past the latest deadline of the
	// items it serves; default DefaultFetchTimeout.
	FetchTimeout time.Duration
	// InlineBelow: output frames of fewer pixel bytes go inline, not by
	// reference; 0: DefaultInlineBelow; negative: every frame by
	// reference.
	InlineBelow int
	// Ingest, with Addr set, takes the camera streams the coordinator
	// routes to this worker (issue 41): their frames are held in Store
	// like outputs. nil: this worker ingests no camera.
	Ingest *IngestServer
}

func (dp *DataPlane) inlineBelow() int {
	if dp.InlineBelow == 0 {
		return DefaultInlineBelow
	}
	return dp.InlineBelow
}

// fetcher resolves frame references into frames: from this worker's own
// store, or over one Fetch per holder. Connections to peers are kept; a
// holder whose fetch just failed fails the next ones at once for
// failFast, rather than have each wait for its own timeout.
type fetcher struct {
	self    string
	dp      *DataPlane
	clk     clock.Clock
	mu      sync.Mutex
	conns   map[string]*grpc.ClientConn
	down    map[string]downHolder // by address: a fetch failed recently
	fetched uint64                // frames fetched from peers
	failed  uint64                // fetches that failed
}

type downHolder struct {
	until time.Time
	err   error
}

// failFast is how long a holder's failed fetch fails the next ones.
const failFast = time.Second

type fetchStats struct{ fetched, failed uint64 }

func newFetcher(self string, dp *DataPlane, clk clock.Clock) *fetcher {
	return &fetcher{self: self, dp: dp, clk: clk, conns: map[string]*grpc.ClientConn{}, down: map[string]downHolder{}}
}

func (f *fetcher) stats() fetchStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fetchStats{f.fetched, f.failed}
}

func (f *fetcher) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for a, c := range f.conns {
		_ = c.Close()
		delete(f.conns, a)
	}
}

func (f *fetcher) conn(addr string) (*grpc.ClientConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d, ok := f.down[addr]; ok {
		if f.clk.Now().Before(d.until) {
			return nil, fmt.Errorf("a fetch from it failed %v ago: %w", failFast-d.until.Sub(f.clk.Now()).Round(time.Millisecond), d.err)
		}
		delete(f.down, addr)
	}
	if c := f.conns[addr]; c != nil {
		return c, nil
	}
	dial := f.dp.Dial
	if dial == nil {
		dial = Dial
	}
	c, err := dial(addr)
	if err != nil {
		return nil, err
	}
	f.conns[addr] = c
	return c, nil
}

// markDown remembers that a fetch from addr failed, unless the peer there
// answered (a frame it no longer holds, another worker at the address, a
// request it refused): then its connection is fine.
func (f *fetcher) markDown(addr string, err error) {
	switch status.Code(err) {
	case codes.NotFound, codes.FailedPrecondition, codes.InvalidArgument:
		return
	}
	f.mu.Lock()
	f.down[addr] = downHolder{until: f.clk.Now().Add(failFast), err: err}
	f.mu.Unlock()
}

// refsOf lists the items of items whose frames are references.
func refsOf(items []*media.Item) []*media.Item {
	var out []*media.Item
	for _, it := range items {
		if it.Frame != nil && it.Frame.Ref != nil {
			out = append(out, it)
		}
	}
	return out
}

// local says whether a reference is to this worker's own store.
func (f *fetcher) local(r *media.FrameRef) bool { return r.Holder == f.self && f.dp.Store != nil }

// allLocal says whether every reference among refs is local.
func (f *fetcher) allLocal(refs []*media.Item) bool {
	for _, it := range refs {
		if !f.local(it.Frame.Ref) {
			return false
		}
	}
	return true
}

// errPeerLost marks a failed resolution: the task is answered PeerLost.
var errPeerLost = errors.New("peer lost")

// DefaultFetchTimeout is DataPlane.FetchTimeout's default.
const DefaultFetchTimeout = 500 * time.Millisecond

// resolve replaces the references among items by their frames, fetching
// from each holder once (holders in parallel). A fetch may take until the
// latest of the items' deadlines plus FetchTimeout. An error names the
// holder and why; then no item is changed.
func (f *fetcher) resolve(ctx context.Context, items []*media.Item) error {
	type key struct{ holder, addr string }
	groups := map[key][]uint64{}
	var latest time.Time
	for _, it := range items {
		r := it.Frame.Ref
		if f.local(r) {
			continue
		}
		k := key{r.Holder, r.Addr}
		groups[k] = append(groups[k], r.ID)
		if it.Deadline.After(latest) {
			latest = it.Deadline
		}
	}
	got := map[key]map[uint64]*media.Frame{}
	if len(groups) > 0 {
		timeout := f.dp.FetchTimeout
		if timeout <= 0 {
			timeout = DefaultFetchTimeout
		}
		if d := latest.Sub(f.clk.Now()); d > 0 {
			timeout += d
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		var mu sync.Mutex
		var wg sync.WaitGroup
		var errs []error
		for k, ids := range groups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				frames, err := f.fetch(ctx, k.holder, k.addr, ids)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, fmt.Errorf("fetch %d frames from worker %s at %s: %w", len(ids), k.holder, k.addr, err))
					return
				}
				got[k] = frames
			}()
		}
		wg.Wait()
		if len(errs) > 0 {
			f.mu.Lock()
			f.failed++
			f.mu.Unlock()
			return fmt.Errorf("%w: %w", errPeerLost, errors.Join(errs...))
		}
	}
	out := make([]*media.Frame, len(items))
	for i, it := range items {
		r := it.Frame.Ref
		if !f.local(r) {
			out[i] = got[key{r.Holder, r.Addr}][r.ID] // fetch checked every id came
			continue
		}
		fr, ok := f.dp.Store.Get(r.ID, true)
		if !ok {
			return fmt.Errorf("%w: frame %d of stream %s seq %d is no longer held here (past its deadline, or evicted)", errPeerLost, r.ID, it.Stream, it.Seq)
		}
		out[i] = fr
	}
	for i, it := range items {
		if out[i] == nil || out[i].W != it.Frame.W || out[i].H != it.Frame.H {
			return fmt.Errorf("%w: frame %d from worker %s is not the %dx%d the reference said", errPeerLost, it.Frame.Ref.ID, it.Frame.Ref.Holder, it.Frame.W, it.Frame.H)
		}
	}
	for i, it := range items {
		it.Frame = out[i]
	}
	return nil
}

// fetch asks holder at addr for ids (deduplicated) and checks that each
// batch brings exactly the frames it asked for.
func (f *fetcher) fetch(ctx context.Context, holder, addr string, ids []uint64) (map[uint64]*media.Frame, error) {
	seen := map[uint64]bool{}
	uniq := ids[:0:0]
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			uniq = append(uniq, id)
		}
	}
	out := make(map[uint64]*media.Frame, len(uniq))
	for start := 0; start < len(uniq); start += MaxFetchIDs {
		batch := uniq[start:min(len(uniq), start+MaxFetchIDs)]
		if err := f.fetchBatch(ctx, holder, addr, batch, out); err != nil {
			f.markDown(addr, err)
			return nil, err
		}
	}
	f.mu.Lock()
	f.fetched += uint64(len(out))
	f.mu.Unlock()
	return out, nil
}

func (f *fetcher) fetchBatch(ctx context.Context, holder, addr string, batch []uint64, out map[uint64]*media.Frame) error {
	want := make(map[uint64]bool, len(batch))
	for _, id := range batch {
		want[id] = true
	}
	cc, err := f.conn(addr)
	if err != nil {
		return err
	}
	stream, err := api.NewPeerClient(cc).Fetch(ctx, &api.FetchRequest{Holder: holder, Ids: batch})
	if err != nil {
		return err
	}
	for range batch {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		if !want[m.Id] {
			return fmt.Errorf("frame %d was not asked for in this fetch, or came twice", m.Id)
		}
		delete(want, m.Id)
		if m.Frame.GetRef() != nil {
			return fmt.Errorf("frame %d came as a reference, not pixels", m.Id)
		}
		fr, err := wire.FrameFromPB(m.Frame)
		if err != nil || fr == nil {
			return fmt.Errorf("frame %d: %v", m.Id, err)
		}
		out[m.Id] = fr
	}
	return nil
}
