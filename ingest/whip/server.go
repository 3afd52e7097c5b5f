package whip

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pion/sdp/v3"
	"github.com/pion/webrtc/v4"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/ingest"
	"github.com/mdag/mdag/internal/auth"
	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/internal/defaults"
	"github.com/mdag/mdag/media"
)

// Sink is where streams go: the engine (Join, Leave and Ingest of
// *coordinator.Engine). A stream joins when its first frame has decoded, and
// leaves only if it joined. A Sink may also implement Admitter.
type Sink interface {
	Join(app dag.AppID, streamID string) error
	Leave(streamID string) error
	Ingest(streamID string, seq uint64, capture time.Time, f *media.Frame, truth []media.Box) error
}

// AudioSink is a Sink that takes audio too (IngestAudio of
// *coordinator.Engine): a server with an audio app (Config.Media) needs
// one. A stream of an audio app hands it PCM chunks, numbered from 1 like
// frames, each 1/fps of the app long.
type AudioSink interface {
	IngestAudio(streamID string, seq uint64, capture time.Time, a *media.Audio) error
}

// Oversize is what happens to frames above the configured resolution.
type Oversize string

const (
	Downscale Oversize = "downscale" // scaled down to fit, aspect kept (default)
	Reject    Oversize = "reject"    // the stream is ended with the reason
)

// Config configures a Server.
type Config struct {
	// Apps are the deployed apps and the rate each samples frames at (0:
	// every frame); for an audio app, chunks per second (each chunk is
	// 1/fps of audio; 0: 20 ms).
	Apps map[dag.AppID]float64
	// Media is each app's kind of stream (dag.App.Media); an app not in
	// it takes video. An audio app's offers must send Opus audio (video in
	// them is read and discarded); a video app's must send video (audio
	// is read and discarded).
	Media map[dag.AppID]dag.Media
	// Codecs are the video codecs accepted (CodecVP8, CodecH264), in
	// order of preference: a stream is answered with the first of them its
	// offer has (default DefaultCodecs).
	Codecs []string
	// Tokens are the accepted bearer tokens in the simple form (each may
	// stream into every app and read results; the API stays open); none
	// and no Auth: open (the caller decides whether that is allowed).
	Tokens []string
	// Auth, when set, replaces Tokens: the tokens of a tokens file, each
	// with its role (ingest tokens POST to their apps only; /v1/streams
	// and /v1/ingest need an api token when Auth.GatesAPI), its stream
	// limit and its resolution and fps caps (see internal/auth).
	Auth *auth.Store
	// OfferRates limits WHIP POSTs per client IP and in all (token
	// buckets on Clock); above them a POST gets 429 with Retry-After.
	// Zero: no limit.
	OfferRates auth.Rates
	// AllowOrigins are the web origins (scheme://host[:port]) whose pages
	// may call WHIP and /v1/streams from a browser (CORS); "*": any page.
	// The server's own origin (the request's Host) is always allowed; a
	// request from any other origin gets 403, and its preflight no
	// permissive headers. Clients outside a browser send no Origin.
	AllowOrigins []string
	// MaxStreams is the most admitted streams at once (default 64); above
	// it a POST gets 503 with Retry-After. A stream is admitted when its
	// first frame decodes; until then it is pending.
	MaxStreams int
	// MaxPending is the most pending streams at once (POSTed, no frame
	// decoded yet; default MaxStreams); above it a POST gets 503.
	MaxPending int
	// ConnectTimeout ends a pending stream whose first frame has not
	// decoded this long after its offer (default 10 s).
	ConnectTimeout time.Duration
	RetryAfter     time.Duration // default 5 s
	// CPUCores is the CPU this process may use, in cores (default
	// runtime.GOMAXPROCS(0)); CPUCeiling the share of it admission fills
	// (default 0.7). A POST whose predicted CPU load does not fit gets 503
	// (see admission.go).
	CPUCores, CPUCeiling float64
	// StreamCost is a new stream's predicted CPU load in cores until a
	// stream has been measured (default 0.15).
	StreamCost float64
	// LoadInterval is how often the load is sampled (default 1 s);
	// ShedAfter how long the load may stay above capacity before the
	// newest admitted streams are ended with reason overload (default 3 s;
	// negative: never shed).
	LoadInterval, ShedAfter time.Duration
	// CPUTime is the process's CPU time so far (default ProcessCPUTime;
	// tests feed their own). MachineCPU, when set, is the machine's busy
	// and total CPU time and its cores, counted when larger than the
	// process's (with MachineWide and CPUTime unset it defaults to
	// MachineCPUTime where this process may use every core of the machine).
	CPUTime    func() time.Duration
	MachineCPU func() (busy, total time.Duration, cores int)
	// MachineWide counts the machine's busy cores too (other processes on
	// the same cores: co-located clients, other services). Off by default:
	// then only this process's CPU counts, and a busy neighbour cannot get
	// streams refused or shed.
	MachineWide bool
	// MaxWidth and MaxHeight bound decoded frames (default 1920x1080);
	// Oversize says what happens above them.
	MaxWidth, MaxHeight int
	// Scale downscales oversize frames; default media.ScaleArea (pure
	// Go). The full binary injects OpenCV's, which is faster.
	Scale    media.Scaler
	Oversize Oversize
	// IdleTimeout ends a stream that sent no media for this long (default
	// 10 s; it also covers a stream whose ICE never connects).
	IdleTimeout time.Duration
	// UDPPortMin/Max restrict the ports ICE uses (0: ephemeral).
	UDPPortMin, UDPPortMax uint16
	// PublicIPs are announced as host candidates instead of the local
	// addresses (1:1 NAT, e.g. a node's external IP in Kubernetes).
	PublicIPs []string
	// Objects, when set, makes a per-stream estimator of the objects in
	// each ingested frame, handed to the session as the frame's ground
	// truth for emulated detectors (ingest.NewMotion); nil: none.
	Objects func() Objects
	// Delegate, when set, hands each video stream's offer to an ingest
	// worker (delegate.go): its media goes there, its results, status and
	// DELETE stay here. nil: every stream is taken here.
	Delegate Delegator
	// OnEnded, when set, is told of every stream that ended (its ID, end
	// kind and why), after it left the sink: a worker's server tells the
	// coordinator of its delegated streams that ended.
	OnEnded func(id, kind, why string)
	Clock   clock.Clock
	Log     *slog.Logger
}

// Objects estimates a stream's objects frame by frame (one per stream,
// used from its media goroutine only).
type Objects interface {
	Boxes(f *media.Frame) []media.Box
	Close()
}

// withDefaults fills the zero fields of c with their defaults and refuses
// the ones out of range, naming each: a negative limit is a mistake to
// report, not a value to replace.
func (c Config) withDefaults() (Config, error) {
	f := defaults.Fields{Prefix: "whip.Config"}
	count, dur, num := f.Count, f.Duration, f.Between
	if len(c.Codecs) == 0 {
		c.Codecs = DefaultCodecs
	} else if err := checkCodecs(c.Codecs); err != nil {
		f.Bad("Codecs", strings.Join(c.Codecs, ","), err.Error())
	}
	count("MaxStreams", &c.MaxStreams, 64)
	count("MaxPending", &c.MaxPending, c.MaxStreams)
	dur("ConnectTimeout", &c.ConnectTimeout, 10*time.Second)
	num("CPUCores", &c.CPUCores, float64(runtime.GOMAXPROCS(0)), 0)
	num("CPUCeiling", &c.CPUCeiling, 0.7, 1)
	num("StreamCost", &c.StreamCost, 0.15, 0)
	if c.CPUTime == nil {
		c.CPUTime = ProcessCPUTime
		if c.MachineCPU == nil && c.MachineWide {
			c.MachineCPU = machineCPU(c.CPUCores)
		}
	}
	dur("LoadInterval", &c.LoadInterval, time.Second)
	if c.ShedAfter == 0 { // negative: never shed
		c.ShedAfter = 3 * time.Second
	}
	dur("RetryAfter", &c.RetryAfter, 5*time.Second)
	if c.Scale == nil {
		c.Scale = media.ScaleArea
	}
	count("MaxWidth", &c.MaxWidth, 1920)
	count("MaxHeight", &c.MaxHeight, 1080)
	if c.Oversize == "" {
		c.Oversize = Downscale
	} else if c.Oversize != Downscale && c.Oversize != Reject {
		f.Bad("Oversize", c.Oversize, "want downscale or reject")
	}
	dur("IdleTimeout", &c.IdleTimeout, 10*time.Second)
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c, f.Err()
}

// Server is the WHIP endpoint, the results endpoints and the browser page.
type Server struct {
	cfg  Config
	sink Sink
	api  *webrtc.API
	clk  clock.Clock
	log  *slog.Logger

	origins map[string]bool  // normalized AllowOrigins
	auth    *auth.Store      // nil: open
	offers  *auth.Limiter    // nil: no rate limit on POST
	logs    *auth.LogLimiter // refusals a client can cause are logged at most once per reason and interval
	cameras atomic.Pointer[func() []ingest.Camera]

	mu      sync.Mutex
	streams map[string]*stream
	// delegated are the streams whose media an ingest worker takes
	// (Config.Delegate): here for their results, status and DELETE
	delegated map[string]*stream
	// pending are the delegated streams whose worker is answering: true
	// once ended meanwhile
	pending  map[string]bool
	reserved int            // POSTs between the limit check and the stream's creation
	byToken  map[string]int // streams (live and reserved) per token name, for its MaxStreams
	closed   bool
	wg       sync.WaitGroup
	ended    []StreamInfo              // the last streams that ended, newest last
	totals   map[string]*ingest.Totals // counters of the streams that ended and refusals, by app

	// The CPU load (admission.go), as of the last sample.
	loadTimer                                           clock.Timer
	cpuAt                                               time.Time
	cpuLast                                             time.Duration
	cpuLoad, cpuRate, procLoad                          float64 // smoothed, the last interval's, the process's smoothed
	mBusy, mTotal                                       time.Duration
	cpuSamples                                          int
	loadMeasured, loadPredicted, loadCost, loadCapacity float64
	overSince                                           time.Time // since when the measured load is above capacity
	lastShed                                            time.Time // the last shed or simulcast step down
	roomSince                                           time.Time // since when the load is well below capacity (simulcast steps up)
}

// New returns a server feeding sink.
func New(cfg Config, sink Sink) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("whip: %w", err)
	}
	origins := map[string]bool{}
	for _, o := range cfg.AllowOrigins {
		n, err := NormalizeOrigin(o)
		if err != nil {
			return nil, fmt.Errorf("whip: allowed origin: %w", err)
		}
		origins[n] = true
	}
	api, err := newAPI(cfg.Codecs, func(se *webrtc.SettingEngine) error {
		if cfg.UDPPortMin > 0 || cfg.UDPPortMax > 0 {
			if err := se.SetEphemeralUDPPortRange(cfg.UDPPortMin, cfg.UDPPortMax); err != nil {
				return fmt.Errorf("whip: UDP port range %d-%d: %w", cfg.UDPPortMin, cfg.UDPPortMax, err)
			}
		}
		if len(cfg.PublicIPs) > 0 {
			se.SetNAT1To1IPs(cfg.PublicIPs, webrtc.ICECandidateTypeHost)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if cfg.CPUCeiling > 1 {
		return nil, fmt.Errorf("whip: CPU ceiling %g: want a share of the cores in (0, 1]", cfg.CPUCeiling)
	}
	for app, m := range cfg.Media {
		if _, ok := cfg.Apps[app]; !ok {
			return nil, fmt.Errorf("whip: Config.Media names app %s, which is not in Config.Apps", app)
		}
		if m != dag.Video && m != dag.Audio {
			return nil, fmt.Errorf("whip: Config.Media[%s] = %q: want video or audio", app, m)
		}
		if _, ok := sink.(AudioSink); m == dag.Audio && !ok {
			return nil, fmt.Errorf("whip: app %s takes audio but the sink (%T) has no IngestAudio", app, sink)
		}
	}
	s := &Server{cfg: cfg, sink: sink, api: api, clk: cfg.Clock, log: cfg.Log, streams: map[string]*stream{}, delegated: map[string]*stream{}, pending: map[string]bool{},
		totals: map[string]*ingest.Totals{}, origins: origins, auth: cfg.Auth, byToken: map[string]int{},
		offers: auth.NewLimiter(cfg.OfferRates, cfg.Clock), logs: &auth.LogLimiter{Clock: cfg.Clock, Log: cfg.Log, Every: 10 * time.Second}}
	if s.auth == nil && len(cfg.Tokens) > 0 {
		s.auth = auth.FromPlain(cfg.Tokens)
	}
	s.auth.UseClock(cfg.Clock) // the failure throttle on the server's clock
	s.armLoad()
	return s, nil
}

// Open reports whether the server accepts streams without a token.
func (s *Server) Open() bool { return s.auth.Len() == 0 }

// Handler serves:
//
//	POST    /whip/{app}              SDP offer -> 201, SDP answer, Location
//	DELETE  /whip/{app}/{id}         end the stream
//	PATCH   /whip/{app}/{id}         405: no trickle ICE (candidates are in the answer)
//	OPTIONS /whip/...                CORS preflight
//	GET     /v1/streams              the streams and their counters (JSON)
//	GET     /v1/ingest               the admission state: admitted, pending, CPU load, refusals (JSON)
//	GET     /v1/streams/{id}/results per-frame results as Server-Sent Events
//	GET     /stream/{app}            the browser page (camera -> WHIP, results drawn over the video)
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /whip/{app}", s.handlePost)
	mux.HandleFunc("DELETE /whip/{app}/{id}", s.handleDelete)
	mux.HandleFunc("PATCH /whip/{app}/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !s.cors(w, r) {
			return
		}
		w.Header().Set("Allow", "DELETE, OPTIONS")
		httpError(w, http.StatusMethodNotAllowed, "trickle ICE is not supported: the answer carries all candidates")
	})
	mux.HandleFunc("OPTIONS /whip/", func(w http.ResponseWriter, r *http.Request) {
		if !s.cors(w, r) {
			return
		}
		w.Header().Set("Accept-Post", "application/sdp")
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("OPTIONS /v1/streams/", func(w http.ResponseWriter, r *http.Request) {
		if !s.cors(w, r) {
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/streams", s.handleList)
	mux.HandleFunc("GET /v1/ingest", s.handleAdmission)
	mux.HandleFunc("GET /v1/streams/{id}/results", s.handleResults)
	mux.HandleFunc("GET /stream/{app}", s.handlePage)
	mux.Handle("GET /static/", http.FileServerFS(staticFS))
	return mux
}

func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	fmt.Fprintln(w, msg)
}

// RequireToken wraps h so that, when the server has tokens, a request
// needs one (Authorization: Bearer, or access_token in the query, for
// browsers' img and EventSource) with the api role. The dashboard's stream
// thumbnails use it: they are camera pixels.
func (s *Server) RequireToken(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.allowed(w, r, true, func(t *auth.Token) bool { return t.Has(auth.API) }) {
			h.ServeHTTP(w, r)
		}
	})
}

// allowed checks the request's bearer token (the header, or where query
// is set the access_token parameter, RFC 6750 2.3: EventSource cannot set
// headers) with may; an open server allows everything. Every failure,
// a missing token, an unknown one or one without the right (another app,
// another role), gets the same 401 (auth.Unauthorized), counted and
// logged (rate-limited) under reason unauthorized.
func (s *Server) allowed(w http.ResponseWriter, r *http.Request, query bool, may func(*auth.Token) bool) bool {
	if s.Open() {
		return true
	}
	// an address that failed FailRates' burst is refused before its token
	// is looked at: guessing costs the guesser time, not the server
	tok, _ := auth.Bearer(r, query)
	if t := s.auth.Lookup(tok); t != nil && may(t) {
		return true
	}
	// an address failing beyond auth.FailRates gets 429 for its failures
	// (a valid token still passes: clients behind one proxy share it)
	if retry, throttled := s.auth.Throttled(r); throttled {
		s.countRefused(s.appLabel(r.PathValue("app")), RefusedRateLimit)
		s.logs.Warn(RefusedRateLimit, "HTTP request refused: too many failed authentications from its address", "client", clientIP(r), "retry_after", retry)
		w.Header().Set("Retry-After", strconv.Itoa(int(retry.Seconds())))
		httpError(w, http.StatusTooManyRequests, fmt.Sprintf("too many failed authentications from this address; retry in %d s", int(retry.Seconds())))
		return false
	}
	s.auth.Failed(r)
	s.countRefused(s.appLabel(r.PathValue("app")), RefusedUnauthorized)
	s.logs.Warn(RefusedUnauthorized, "HTTP request refused: no valid bearer token for it", "method", r.Method, "path", r.URL.Path, "client", clientIP(r))
	auth.Unauthorized(w)
	return false
}

// apiAllowed is allowed for the API endpoints (/v1/streams, /v1/ingest):
// with a tokens file they need an api token; in the simple form any token
// (/v1/streams) or none (/v1/ingest, counts only), as before.
func (s *Server) apiAllowed(w http.ResponseWriter, r *http.Request, simpleNeedsToken bool) bool {
	if !s.auth.GatesAPI() && !simpleNeedsToken {
		return true
	}
	return s.allowed(w, r, true, func(t *auth.Token) bool { return t.Has(auth.API) })
}

// appLabel is the app a refusal is counted under: the app when it is
// deployed, else AppUnknown (a path's name must not make a new series).
func (s *Server) appLabel(app string) dag.AppID {
	if _, ok := s.cfg.Apps[dag.AppID(app)]; ok {
		return dag.AppID(app)
	}
	return AppUnknown
}

// AppUnknown is the app label of refusals of requests for no deployed app.
const AppUnknown = "-"

// clientIP is the request's peer address without its port (proxies'
// X-Forwarded-For is not trusted: any client can send one).
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

const maxOffer = 64 << 10

func (s *Server) handlePost(w http.ResponseWriter, r *http.Request) {
	if !s.cors(w, r) {
		return
	}
	// The address's rate limit comes first: a flood of guessed tokens is a
	// flood. The global one only after authentication, so that clients
	// without a token, from however many addresses, cannot spend it and
	// keep the token holders out.
	limited := func(scope string, retry time.Duration) {
		s.countRefused(s.appLabel(r.PathValue("app")), RefusedRateLimit)
		s.logs.Warn(RefusedRateLimit, "WHIP offers rate-limited", "scope", scope, "client", clientIP(r), "retry_after", retry)
		w.Header().Set("Retry-After", strconv.Itoa(int(retry.Seconds())))
		what := "from this address"
		if scope == auth.ScopeGlobal {
			what = "in all"
		}
		httpError(w, http.StatusTooManyRequests, fmt.Sprintf("too many WHIP offers %s; retry in %d s", what, int(retry.Seconds())))
	}
	if ok, retry := s.offers.AllowClient(auth.AddrKey(clientIP(r))); !ok {
		limited(auth.ScopeClient, retry)
		return
	}
	var tok *auth.Token
	if !s.allowed(w, r, false, func(t *auth.Token) bool { tok = t; return t.MayStream(r.PathValue("app")) }) {
		return
	}
	if ok, retry := s.offers.AllowGlobal(); !ok {
		limited(auth.ScopeGlobal, retry)
		return
	}
	app := dag.AppID(r.PathValue("app"))
	fps, ok := s.cfg.Apps[app]
	if !ok {
		msg := fmt.Sprintf("unknown app %q (deployed: %s)", app, s.appList())
		if tok != nil && !slices.Contains(tok.Apps, "*") {
			// a token for some apps learns of no app beyond its own
			msg = fmt.Sprintf("unknown app %q: it is not deployed", app)
		}
		httpError(w, http.StatusNotFound, msg)
		return
	}
	caps := s.capsFor(fps, tok)
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(strings.ToLower(ct), "application/sdp") {
		httpError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q: a WHIP offer is application/sdp", ct))
		return
	}
	// the offer arrives within OfferReadTimeout: a client trickling its
	// body holds this handler no longer
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(OfferReadTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxOffer))
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			httpError(w, http.StatusRequestTimeout, fmt.Sprintf("offer: the body did not arrive within %v", OfferReadTimeout))
			return
		}
		httpError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("offer: %v (limit %d bytes)", err, maxOffer))
		return
	}
	body, pick, code, msg := s.checkOfferFor(app, body)
	if code != 0 {
		httpError(w, code, msg)
		return
	}
	unavailable := func(reason, msg string) {
		s.countRefused(app, reason)
		s.log.Warn("whip stream refused", "app", app, "reason", reason, "why", msg)
		w.Header().Set("Retry-After", strconv.Itoa(int(max(1, s.cfg.RetryAfter.Round(time.Second).Seconds()))))
		httpError(w, http.StatusServiceUnavailable, msg+"; retry later")
	}
	if ad, ok := s.sink.(Admitter); ok {
		if err := ad.Admit(app); err != nil {
			unavailable(RefusedSession, fmt.Sprintf("app %s refuses new streams: %v", app, err))
			return
		}
	}
	if msg := s.reserveToken(tok); msg != "" {
		s.countRefused(app, RefusedTokenLimit)
		s.logs.Warn(RefusedTokenLimit, "whip stream refused", "app", app, "token", tok.Name, "why", msg)
		w.Header().Set("Retry-After", strconv.Itoa(int(max(1, s.cfg.RetryAfter.Round(time.Second).Seconds()))))
		httpError(w, http.StatusTooManyRequests, msg)
		return
	}
	if s.cfg.Delegate != nil && s.mediaOf(app) == dag.Video {
		// an ingest worker takes the stream's media, unless none does
		if st, answer, code, err := s.delegate(r.Context(), app, caps, body); err == nil {
			created(w, st, answer)
			return
		} else if !errors.Is(err, ErrNotDelegated) {
			s.unreserveToken(caps.token)
			s.countRefused(app, RefusedDelegate)
			s.logs.Warn(RefusedDelegate, "whip stream refused: no ingest worker took it", "app", app, "why", err)
			if code == http.StatusServiceUnavailable {
				w.Header().Set("Retry-After", strconv.Itoa(int(max(1, s.cfg.RetryAfter.Round(time.Second).Seconds()))))
			}
			httpError(w, code, err.Error())
			return
		}
	}
	if reason, msg := s.reserve(); reason != "" {
		s.unreserveToken(caps.token)
		unavailable(reason, msg)
		return
	}
	st, answer, code, err := s.start(app, caps, string(body), pick, newID())
	if err != nil {
		s.unreserve()
		s.unreserveToken(caps.token)
		httpError(w, code, err.Error())
		return
	}
	created(w, st, answer)
}

// created answers a POST whose stream started (here or on a worker).
func created(w http.ResponseWriter, st *stream, answer string) {
	h := w.Header()
	h.Set("Content-Type", "application/sdp")
	h.Set("Location", "/whip/"+string(st.app)+"/"+st.id)
	h.Set("Mdag-Stream", st.id)
	h.Set("Mdag-Results", "/v1/streams/"+st.id+"/results")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, answer)
}

func (s *Server) appList() string {
	var names []string
	for a := range s.cfg.Apps {
		names = append(names, string(a))
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// statusRecvonly is checkOffer's answer for an offer that does not send
// video (a 400, counted as a refusal).
const statusRecvonly = -http.StatusBadRequest

// checkOffer parses the offer before WebRTC sees it: the codec to answer
// with (the first of codecs, the server's order of preference, that the
// offer has), or 400 with the reason for malformed SDP, an offer without
// video, no supported codec, or video the offer does not send (recvonly,
// inactive: statusRecvonly).
func checkOffer(body []byte, codecs []string) (offeredCodec, int, string) {
	code, msg, offer := checkOfferVideo(body)
	if code != 0 {
		return offeredCodec{}, code, msg
	}
	pick, _, offered, ok := chooseCodec(offer, codecs)
	if ok {
		return pick, 0, ""
	}
	if len(offered) == 0 {
		return offeredCodec{}, http.StatusBadRequest, "the offer's video section lists no codecs (a=rtpmap); supported: " + supported(codecs)
	}
	return offeredCodec{}, http.StatusBadRequest, fmt.Sprintf("no supported video codec in the offer (offered: %s); supported: %s", strings.Join(offered, ", "), supported(codecs))
}

// checkOfferVideo checks the offer has a video section that sends, and
// lists its payload types (every video section's, in order).
func checkOfferVideo(body []byte) (int, string, []offeredCodec) {
	var d sdp.SessionDescription
	if err := d.Unmarshal(body); err != nil {
		return http.StatusBadRequest, fmt.Sprintf("malformed SDP offer: %v", err), nil
	}
	var offer []offeredCodec
	video := false
	for _, m := range d.MediaDescriptions {
		if m.MediaName.Media != "video" {
			continue
		}
		video = true
		dir := direction(m, &d)
		if dir == "recvonly" || dir == "inactive" {
			return statusRecvonly, fmt.Sprintf("the offer's video section is %s: a WHIP offer must send video (sendonly or sendrecv)", dir), nil
		}
		offer = append(offer, videoCodecs(m)...)
	}
	if !video {
		return http.StatusBadRequest, noVideo + "; mdag ingests video (VP8, H264)", nil
	}
	return 0, "", offer
}

// noVideo begins checkOfferVideo's answer to an offer without video.
const noVideo = "the offer has no video media section (m=video)"

// mediaOf is app's kind of stream (video unless Config.Media says audio).
func (s *Server) mediaOf(app dag.AppID) dag.Media {
	if m := s.cfg.Media[app]; m != "" {
		return m
	}
	return dag.Video
}

// checkAudioOffer is checkOffer for an audio app: the offer must have an
// audio section that sends (sendonly or sendrecv) with Opus
// (opus/48000/2); else 400 with the reason (an offer that only sends
// video, a recvonly audio section: statusRecvonly, an audio section
// without Opus). Video sections are allowed: their media is read and
// discarded.
func checkAudioOffer(body []byte, app dag.AppID) (offeredCodec, int, string) {
	var d sdp.SessionDescription
	if err := d.Unmarshal(body); err != nil {
		return offeredCodec{}, http.StatusBadRequest, fmt.Sprintf("malformed SDP offer: %v", err)
	}
	audio, video := false, false
	var offered []string
	for _, m := range d.MediaDescriptions {
		switch m.MediaName.Media {
		case "video":
			video = true
			continue
		case "audio":
		default:
			continue
		}
		audio = true
		if dir := direction(m, &d); dir == "recvonly" || dir == "inactive" {
			return offeredCodec{}, statusRecvonly, fmt.Sprintf("app %s takes audio and the offer's audio section is %s: a WHIP offer must send audio (sendonly or sendrecv)", app, dir)
		}
		for _, o := range videoCodecs(m) {
			if o.ours() == CodecOpus {
				return o, 0, ""
			}
			if d := o.name; !slices.Contains(offered, d) {
				offered = append(offered, d)
			}
		}
	}
	switch {
	case !audio && video:
		return offeredCodec{}, http.StatusBadRequest, fmt.Sprintf("app %s takes audio: the offer sends only video (no m=audio section); send an Opus audio track", app)
	case !audio:
		return offeredCodec{}, http.StatusBadRequest, fmt.Sprintf("app %s takes audio: the offer has no audio media section (m=audio); send an Opus audio track", app)
	case len(offered) == 0:
		return offeredCodec{}, http.StatusBadRequest, fmt.Sprintf("app %s takes audio: the offer's audio section lists no codecs (a=rtpmap); supported: opus/48000/2", app)
	}
	return offeredCodec{}, http.StatusBadRequest, fmt.Sprintf("app %s takes audio: no Opus in the offer (offered: %s); supported: opus/48000/2 (RFC 7587)", app, strings.Join(offered, ", "))
}

// direction is a media section's direction: its own attribute, else the
// session's (RFC 8866 6.7), else sendrecv ("").
func direction(m *sdp.MediaDescription, d *sdp.SessionDescription) string {
	for _, attrs := range [][]sdp.Attribute{m.Attributes, d.Attributes} {
		for _, a := range attrs {
			if a.Key == "sendonly" || a.Key == "sendrecv" || a.Key == "recvonly" || a.Key == "inactive" {
				return a.Key
			}
		}
	}
	return ""
}

// reserve takes a pending slot for a POST, or says why not: the stream
// limit (admitted streams), the pending limit, or the decoding capacity.
func (s *Server) reserve() (reason, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	admitted, pending := s.countsLocked()
	switch {
	case s.closed:
		return RefusedShutdown, "server shutting down"
	case admitted >= s.cfg.MaxStreams:
		return RefusedStreamLimit, fmt.Sprintf("stream limit reached (%d streams)", s.cfg.MaxStreams)
	case pending >= s.cfg.MaxPending:
		return RefusedPendingLimit, fmt.Sprintf("pending limit reached (%d streams have not sent their first frame yet)", s.cfg.MaxPending)
	}
	if v := s.loadLocked(nil); !v.fits() {
		return RefusedCapacity, "no CPU capacity: " + v.String()
	}
	s.reserved++
	return "", ""
}

func (s *Server) unreserve() {
	s.mu.Lock()
	s.reserved--
	s.mu.Unlock()
}

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// start creates the stream (pending: it joins the app's session when its
// first frame decodes), answers the offer and waits for ICE gathering (the
// answer carries every candidate).
func (s *Server) start(app dag.AppID, caps streamCaps, offer string, pick offeredCodec, id string) (*stream, string, int, error) {
	pc, err := s.api.NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		return nil, "", http.StatusInternalServerError, fmt.Errorf("peer connection: %v", err)
	}
	st := newStream(s, id, app, caps.fps, pc)
	st.maxW, st.maxH = caps.maxW, caps.maxH
	if pick.ours() == CodecOpus {
		st.audioFmtp = pick.fmtp
	}
	fail := func(code int, err error) (*stream, string, int, error) {
		st.endAs(EndSetupFailed, "setup failed: "+err.Error())
		return nil, "", code, err
	}
	if err := pc.SetRemoteDescription(webrtc.SessionDescription{Type: webrtc.SDPTypeOffer, SDP: offer}); err != nil {
		return fail(http.StatusBadRequest, fmt.Errorf("offer rejected: %v", err))
	}
	// Answer with the one codec chosen (the server's preference, not the
	// offer's): the sender then has no other to send. An audio app's pick
	// is Opus, for the audio sections.
	kind := webrtc.RTPCodecTypeVideo
	if pick.ours() == CodecOpus {
		kind = webrtc.RTPCodecTypeAudio
	}
	for _, t := range pc.GetTransceivers() {
		if t.Kind() != kind {
			continue
		}
		if err := t.SetCodecPreferences([]webrtc.RTPCodecParameters{{
			RTPCodecCapability: webrtc.RTPCodecCapability{MimeType: codecMime(pick.ours()), ClockRate: pick.clock, Channels: uint16(pick.channels), SDPFmtpLine: pick.fmtp},
			PayloadType:        webrtc.PayloadType(pick.pt),
		}}); err != nil {
			return fail(http.StatusBadRequest, fmt.Errorf("cannot answer with %s: %v", pick.describe(), err))
		}
	}
	ans, err := pc.CreateAnswer(nil)
	if err != nil {
		return fail(http.StatusBadRequest, fmt.Errorf("cannot answer the offer: %v", err))
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(ans); err != nil {
		return fail(http.StatusInternalServerError, fmt.Errorf("local description: %v", err))
	}
	select {
	case <-gathered:
	case <-s.clk.After(5 * time.Second):
		return fail(http.StatusInternalServerError, errors.New("ICE candidate gathering did not finish in 5 s"))
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fail(http.StatusServiceUnavailable, errors.New("server shutting down"))
	}
	if s.streams[id] != nil || s.delegated[id] != nil {
		s.mu.Unlock()
		return fail(http.StatusConflict, fmt.Errorf("stream %q exists", id))
	}
	s.reserved--
	s.streams[id] = st
	st.token = caps.token // from here, removed gives the token's slot back
	s.mu.Unlock()
	st.armIdle()
	st.armConnect()
	s.log.Info("whip stream started (pending until its first frame decodes)", "app", app, "stream", id, "fps", caps.fps,
		"max_resolution", fmt.Sprintf("%dx%d", caps.maxW, caps.maxH), "token", caps.token)
	return st, pc.LocalDescription().SDP, 0, nil
}

func (s *Server) lookup(id string) *stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.streams[id]; st != nil {
		return st
	}
	return s.delegated[id]
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	if !s.cors(w, r) || !s.allowed(w, r, false, func(t *auth.Token) bool { return t.Has(auth.API) || t.MayStream(r.PathValue("app")) }) {
		return
	}
	st := s.lookup(r.PathValue("id"))
	if st == nil || string(st.app) != r.PathValue("app") {
		httpError(w, http.StatusNotFound, fmt.Sprintf("no stream %q in app %q", r.PathValue("id"), r.PathValue("app")))
		return
	}
	st.endAs(EndClient, "deleted by the client")
	w.WriteHeader(http.StatusOK)
}

// removed is called once by a stream that ended.
func (s *Server) removed(st *stream, info StreamInfo) {
	s.mu.Lock()
	if s.streams[st.id] == st {
		delete(s.streams, st.id)
		s.releaseTokenLocked(st.token)
	} else if s.delegated[st.id] == st {
		delete(s.delegated, st.id)
		s.releaseTokenLocked(st.token)
	}
	s.ended = append(s.ended, info)
	t := s.totalsLocked(info.App)
	addInfo(t, info)
	t.Ended[info.EndKind]++
	if len(s.ended) > 100 {
		s.ended = s.ended[len(s.ended)-100:]
	}
	s.mu.Unlock()
}

// totalsLocked is app's counters of ended streams and refusals (s.mu held).
func (s *Server) totalsLocked(app string) *ingest.Totals {
	t := s.totals[app]
	if t == nil {
		t = &ingest.Totals{App: app, Refused: map[string]uint64{}, Ended: map[string]uint64{}}
		s.totals[app] = t
	}
	return t
}

// Publish hands a frame's outcome to its stream's result subscribers
// (coordinator.Config.OnFrame); it never blocks.
//
// A result for a stream that has ended (its frame was in flight when the
// client left or the stream was ended) cannot be delivered: it is counted
// in the ended stream's ResultsAfterEnd, so a stream's results add up:
// ingested = results sent + dropped (slow or gone client) + after end.
func (s *Server) Publish(r Result) {
	s.mu.Lock()
	st, delegated := s.streams[r.Stream], false
	if st == nil {
		st, delegated = s.delegated[r.Stream], true
	}
	s.mu.Unlock()
	if st != nil {
		st.publish(r)
		if delegated {
			s.cfg.Delegate.Result(r.Stream, r) // its client's DataChannel is on its worker
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.ended) - 1; i >= 0; i-- {
		if s.ended[i].ID == r.Stream {
			s.ended[i].ResultsAfterEnd++
			return
		}
	}
}

// Streams lists the live streams, then the last ended ones.
func (s *Server) Streams() []StreamInfo {
	s.mu.Lock()
	live := make([]*stream, 0, len(s.streams)+len(s.delegated))
	for _, st := range s.streams {
		live = append(live, st)
	}
	for _, st := range s.delegated {
		live = append(live, st)
	}
	ended := slices.Clone(s.ended)
	s.mu.Unlock()
	out := make([]StreamInfo, 0, len(live)+len(ended))
	for _, st := range live {
		out = append(out, st.info())
	}
	slices.SortFunc(out, func(a, b StreamInfo) int { return a.Started.Compare(b.Started) })
	return append(out, ended...)
}

// IngestTotals are the ingest counters per deployed app since the server
// started, ended streams included (for /metrics).
func (s *Server) IngestTotals() []ingest.Totals {
	s.mu.Lock()
	by := map[string]*ingest.Totals{}
	for app := range s.cfg.Apps {
		by[string(app)] = &ingest.Totals{App: string(app)}
	}
	for app, t := range s.totals {
		c := *t
		c.Refused, c.Ended = maps.Clone(t.Refused), maps.Clone(t.Ended)
		by[app] = &c
	}
	live := make([]*stream, 0, len(s.streams))
	for _, st := range s.streams {
		live = append(live, st)
	}
	s.mu.Unlock()
	for _, st := range live {
		info := st.info()
		t := by[info.App]
		if t == nil {
			t = &ingest.Totals{App: info.App}
			by[info.App] = t
		}
		addInfo(t, info)
		t.Streams++
		if info.State == StatePending {
			t.Pending++
		}
		if info.Codec != "" {
			if t.Codecs == nil {
				t.Codecs = map[string]int{}
			}
			t.Codecs[info.Codec]++
		}
	}
	out := make([]ingest.Totals, 0, len(by))
	for _, t := range by {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b ingest.Totals) int { return strings.Compare(a.App, b.App) })
	return out
}

func addInfo(t *ingest.Totals, i StreamInfo) {
	t.Packets += i.Packets
	t.Frames += i.Frames
	t.Ingested += i.Ingested
	t.Lost += i.Lost
	t.DecodeErrors += i.DecodeErrors
	t.PLIs += i.PLIs
	t.Discarded += i.Discarded
	t.Restarts += i.Restarts
	t.CameraLost += i.CameraLost
	t.FramesRefused += i.Refused
}

// CPULoad is the measured CPU load as a share of the capacity admission
// fills (for /metrics; 1: full).
func (s *Server) CPULoad() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loadCapacity <= 0 {
		return 0
	}
	return s.loadMeasured / s.loadCapacity
}

// Close ends every stream and waits for their goroutines.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	if s.loadTimer != nil {
		s.loadTimer.Stop()
	}
	live := make([]*stream, 0, len(s.streams)+len(s.delegated))
	for _, st := range s.streams {
		live = append(live, st)
	}
	for _, st := range s.delegated {
		live = append(live, st)
	}
	s.mu.Unlock()
	var ending sync.WaitGroup // at once: each may wait for its clients' goodbyes
	for _, st := range live {
		ending.Add(1)
		go func() {
			defer ending.Done()
			st.endAs(EndShutdown, "server shutting down")
		}()
	}
	ending.Wait()
	s.wg.Wait()
}
