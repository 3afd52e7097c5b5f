package main

import (
	"bufio"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/mdag/mdag/internal/auth"
)

// authFlags are the HTTP side's credentials of serve and coordinator
// (every build: the API exists in the lean build too; WHIP's flags are
// in whip.go).
type authFlags struct {
	tokens        *string
	metricsListen *string
	allowedHosts  *string
}

func addAuthFlags(fs interface {
	String(name, value, usage string) *string
}) *authFlags {
	return &authFlags{
		tokens: fs.String("tokens", "", "tokens file (YAML): per token its sha256 hash, role ingest or api, apps, max_streams, max_resolution, max_fps "+
			"(mdag token new); with it the API (status, dashboard, /metrics, /v1/streams) needs an api token and WHIP an ingest token for its app"),
		metricsListen: fs.String("metrics-listen", "", "also serve /metrics (and /healthz) on this address without a token, e.g. 127.0.0.1:9090 for a Prometheus scraper"),
		allowedHosts: fs.String("allowed-hosts", "", "comma-separated Host names a loopback --listen answers besides localhost and loopback addresses "+
			"(a reverse proxy's public name); any other Host gets 403, the guard against DNS rebinding"),
	}
}

// hosts are --allowed-hosts' names.
func (af *authFlags) hosts() []string {
	if *af.allowedHosts == "" {
		return nil
	}
	return strings.Split(*af.allowedHosts, ",")
}

// load reads --tokens (nil without one) and says how the API is guarded.
func (af *authFlags) load(log *slog.Logger) (*auth.Store, error) {
	if *af.tokens == "" {
		return nil, nil
	}
	s, err := auth.Load(*af.tokens)
	if err != nil {
		return nil, fmt.Errorf("--tokens: %w", err)
	}
	log.Info("HTTP API requires an api bearer token; WHIP an ingest token for its app", "tokens_file", *af.tokens,
		"api_tokens", s.Count(auth.API), "ingest_tokens", s.Count(auth.Ingest))
	if s.Count(auth.API) == 0 {
		log.Warn("the tokens file has no api token: no one can read /v1/status, the dashboard or /metrics on --listen (--metrics-listen serves /metrics without one)")
	}
	return s, nil
}

// guardListen: the HTTP API (status, the dashboard, /metrics, and in the
// lean build everything on --listen) is guarded only by --tokens. On a
// non-loopback --listen without them the lean build refuses (it has no
// WHIP and no --open to say the operator means it); the full build's WHIP
// flags already refuse it unless --open or --token-file, which leave the
// API open: said loudly.
func guardListen(listen string, s *auth.Store, log *slog.Logger) error {
	if s != nil || loopback(listen) {
		return nil
	}
	if buildName == "lean" {
		return fmt.Errorf("--listen %s is not a loopback address and no --tokens is given: anyone who can reach it could read "+
			"/v1/status, the dashboard, /metrics and camera thumbnails; give --tokens FILE (mdag token new), or keep --listen on 127.0.0.1", listen)
	}
	log.Warn("the HTTP API (status, dashboard, /metrics) is open on a non-loopback --listen: give --tokens to require an api token", "listen", listen)
	return nil
}

// serveMetrics serves /metrics and /healthz on addr without a token, for
// a scraper on a private address; "" serves nothing. It returns the
// address and the server to close.
func (o *observed) serveMetrics(addr string) (string, *http.Server, error) {
	if addr == "" {
		return "", nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--metrics-listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", o.mx.Handler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, fmt.Sprintf("no such endpoint: %s %s (this address serves /metrics and /healthz only)", r.Method, r.URL.Path), http.StatusNotFound)
	})
	hs := newHTTPServer(mux, ln, o.hosts)
	go func() { _ = hs.Serve(ln) }()
	return ln.Addr().String(), hs, nil
}

// runToken is mdag token: new prints a fresh token and its tokens-file
// entry; hash prints the hash line of a token read from stdin (not the
// command line, which shells keep in their history).
func runToken(args []string, stdout, stderr io.Writer) int {
	return tokenCmd(args, os.Stdin, stdout, stderr)
}

func tokenCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runGroup("token", tokenUsage, []subcmd{
		{"new", "--app APP [flags]", func() subcommand { return new(tokenNewCmd) }},
		{"hash", "< token.txt", func() subcommand { return &tokenHashCmd{stdin: stdin} }},
	}, args, stdout, stderr)
}

func tokenUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: mdag token new --app APP [--name NAME] [--role ingest|api] [--max-streams N] [--max-resolution WxH] [--max-fps F]\n"+
		"       mdag token hash < token.txt\n\n"+
		"new prints a random token (give it to the client) and the entry to add to the --tokens file (only its sha256 is stored).\n"+
		"hash prints the hash: line of a token read from stdin.")
}

// tokenHashCmd is mdag token hash: no flags; the token comes on stdin.
type tokenHashCmd struct{ stdin io.Reader }

func (c *tokenHashCmd) flags(*flag.FlagSet)            {}
func (c *tokenHashCmd) validate(*flag.FlagSet) []error { return nil }

func (c *tokenHashCmd) run(env *cmdEnv) error {
	line, err := bufio.NewReader(io.LimitReader(c.stdin, 4096)).ReadString('\n')
	if err != nil && err != io.EOF {
		return fmt.Errorf("reading stdin: %w", err)
	}
	h, err := auth.Hash(strings.TrimRight(line, "\r\n"))
	if err != nil {
		return invalid(err)
	}
	fmt.Fprintf(env.stdout, "hash: %s\n", h)
	return nil
}

// tokenNewCmd is mdag token new's options.
type tokenNewCmd struct {
	apps               stringList
	name, role, maxRes string
	maxStreams         int
	maxFPS             float64
}

func (c *tokenNewCmd) flags(fs *flag.FlagSet) {
	fs.Var(&c.apps, "app", "app the token may stream into, repeated or comma-separated (* : every app); ingest tokens")
	fs.StringVar(&c.name, "name", "", "the token's name in logs and refusals (default: the app and a random suffix)")
	fs.StringVar(&c.role, "role", string(auth.Ingest), "ingest (stream into apps) or api (status, dashboard, metrics, streams)")
	fs.IntVar(&c.maxStreams, "max-streams", 0, "most streams at once (0: the server's limit only)")
	fs.StringVar(&c.maxRes, "max-resolution", "", "largest frame WxH its streams are downscaled to (default: the server's)")
	fs.Float64Var(&c.maxFPS, "max-fps", 0, "rate its frames are sampled to (0: the app's)")
}

// validate checks the entry the flags make as the --tokens file's loader
// checks it (on a stand-in token and name): every problem at once.
func (c *tokenNewCmd) validate(*flag.FlagSet) []error {
	name := c.name
	if name == "" {
		name = "a-name"
	}
	h, _ := auth.Hash(auth.NewToken())
	entry := (&tokenNewCmd{apps: c.apps, name: name, role: c.role, maxRes: c.maxRes, maxStreams: c.maxStreams, maxFPS: c.maxFPS}).entry(h)
	if _, err := auth.Parse("the new entry", []byte("tokens:\n"+entry)); err != nil {
		return []error{err}
	}
	return nil
}

func (c *tokenNewCmd) run(env *cmdEnv) error {
	tok := auth.NewToken()
	h, _ := auth.Hash(tok)
	if c.name == "" {
		base := c.role
		if len(c.apps) > 0 && c.apps[0] != "*" {
			base = c.apps[0]
		}
		c.name = tokenName(base, tok)
	}
	entry := c.entry(h)
	// The entry must load as it is printed: the same checks as --tokens.
	if _, err := auth.Parse("the new entry", []byte("tokens:\n"+entry)); err != nil {
		return invalid(err)
	}
	fmt.Fprintf(env.stdout, "token: %s\n# give the token to the client (Authorization: Bearer TOKEN); add this entry under tokens: in the --tokens file:\n%s", tok, entry)
	return nil
}

// entry is the token's entry in the --tokens file, by its hash.
func (c *tokenNewCmd) entry(hash string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  - name: %s\n    hash: %s\n    role: %s\n", c.name, hash, c.role)
	if len(c.apps) > 0 {
		q := make([]string, len(c.apps))
		for i, a := range c.apps {
			q[i] = strconv.Quote(a)
		}
		fmt.Fprintf(&b, "    apps: [%s]\n", strings.Join(q, ", "))
	}
	if c.maxStreams != 0 {
		fmt.Fprintf(&b, "    max_streams: %d\n", c.maxStreams)
	}
	if c.maxRes != "" {
		fmt.Fprintf(&b, "    max_resolution: %s\n", c.maxRes)
	}
	if c.maxFPS != 0 {
		fmt.Fprintf(&b, "    max_fps: %g\n", c.maxFPS)
	}
	return b.String()
}

// tokenName is a new token's default name: base (its app or role) and a
// random suffix of its own, drawn until it shares nothing of four
// characters or more with the token (in either case) (names are logged and listed; they
// must carry no secret material).
func tokenName(base, tok string) string {
	const alphabet = "abcdefghijkmnpqrstuvwxyz23456789" // 32: no 0/o, 1/l
	secret := strings.ToLower(strings.TrimPrefix(tok, "mdag_"))
	tail := strings.ToLower(base[max(0, len(base)-3):]) + "-"
	for try := 0; ; try++ {
		var b [6]byte
		_, _ = rand.Read(b[:])
		for i := range b {
			b[i] = alphabet[b[i]%byte(len(alphabet))]
		}
		// every run of four with a character of the suffix (base is the
		// user's, and a coincidence within it no secret: a run of base's
		// end and the dash alone is not checked, or a token holding it
		// would be redrawn forever)
		name := tail + string(b[:])
		if !sharesRun(name[max(0, len(tail)-3):], secret, 4) || try == 1000 {
			return base + "-" + string(b[:])
		}
	}
}

// sharesRun says whether a and b have a common substring of n bytes.
func sharesRun(a, b string, n int) bool {
	for i := 0; i+n <= len(a); i++ {
		if strings.Contains(b, a[i:i+n]) {
			return true
		}
	}
	return false
}

// stringList is a repeated or comma-separated string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}
