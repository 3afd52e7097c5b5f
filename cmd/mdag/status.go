package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mdag/mdag/coordinator"
	"github.com/mdag/mdag/ingest"
)

// mdag status, and the status table serve's summary and the coordinator's
// share with it.

const statusSynopsis = "[--server ADDR] [-o table|json] [--token-env VAR]"

func runStatus(args []string, stdout, stderr io.Writer) int {
	return execute("status", statusSynopsis, new(statusCmd), args, stdout, stderr)
}

// statusCmd is mdag status's options.
type statusCmd struct {
	server, out, tokenEnv string
	base                  string // the API's URL, from --server by validate
}

func (c *statusCmd) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.server, "server", "http://127.0.0.1:8080", "the mdag serve address: host:port (http:// assumed) or an http:// or https:// URL")
	fs.StringVar(&c.out, "o", "table", "output: table or json")
	fs.StringVar(&c.tokenEnv, "token-env", "MDAG_TOKEN", "environment variable holding an api bearer token (a server started with --tokens needs one); not a flag, so it stays out of the shell's history")
}

func (c *statusCmd) validate(*flag.FlagSet) []error {
	var errs []error
	if c.out != "table" && c.out != "json" {
		errs = append(errs, fmt.Errorf("-o %q: want table or json", c.out))
	}
	var err error
	if c.base, err = serverBase(c.server); err != nil {
		errs = append(errs, fmt.Errorf("--server %q: %v", c.server, err))
	}
	return errs
}

func (c *statusCmd) run(env *cmdEnv) error {
	hc := &http.Client{Timeout: 5 * time.Second}
	var st coordinator.Status
	if err := c.get(hc, "/v1/status", &st); err != nil {
		return err
	}
	if c.out == "json" {
		writeJSON(env.stdout, st, true)
		return nil
	}
	writeStatusTable(env.stdout, st)
	// WebRTC ingest's admission (refused, pending, shed streams), where
	// the server has it: a server without (the lean build) is no error.
	var adm ingest.Admission
	if c.get(hc, "/v1/ingest", &adm) == nil {
		writeIngestLine(env.stdout, adm)
	}
	return nil
}

// get decodes the JSON answer to GET path into v, with the token of
// --token-env when it is set.
func (c *statusCmd) get(hc *http.Client, path string, v any) error {
	req, err := http.NewRequest("GET", c.base+path, nil)
	if err != nil {
		return invalidf("--server %q: %v", c.server, err)
	}
	if tok := os.Getenv(c.tokenEnv); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return fmt.Errorf("%s answered %s: the server has --tokens; put an api token in $%s", c.server, resp.Status, c.tokenEnv)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%s answered %s", c.server, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("bad answer from %s: %v", c.server, err)
	}
	return nil
}

// serverBase is --server as the base URL of the API: host:port (as
// workers and sources take it; http:// is assumed) or an http:// or
// https:// URL, with any path kept and its trailing '/' removed.
func serverBase(s string) (string, error) {
	const want = "want host:port (http:// is assumed) or an http:// or https:// URL, e.g. 127.0.0.1:8080"
	s = strings.TrimSpace(s)
	raw := s
	if !strings.Contains(s, "://") {
		raw = "http://" + s
	}
	u, err := url.Parse(raw)
	switch {
	case s == "":
		return "", errors.New("empty: " + want)
	case err != nil:
		return "", errors.New("not an address: " + want)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("scheme %q: %s", u.Scheme, want)
	case u.Hostname() == "" || u.Opaque != "":
		return "", errors.New("no host: " + want)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(s, "?") || strings.Contains(s, "#"):
		return "", errors.New("user information, a query or a fragment: " + want)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("port %q: want 1..65535", p)
		}
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// statusHandler serves the engine's status (GET /v1/status) and
// /healthz: the API's part that needs nothing but the engine.
func statusHandler(e *coordinator.Engine) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		writeJSON(w, e.Status(), true)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	return mux
}

// loud is an ingest stream's waiting reason to print: what happened
// (before the first ':') in capitals, the rest (a camera's error, with its
// URL) as it is.
func loud(s string) string {
	head, rest, ok := strings.Cut(s, ":")
	if !ok {
		return strings.ToUpper(s)
	}
	return strings.ToUpper(head) + ":" + rest
}

// writeIngestLine prints the WHIP admission state: streams admitted and
// pending, the CPU load against capacity, refusals and server-ended
// streams by reason.
func writeIngestLine(w io.Writer, a ingest.Admission) {
	fmt.Fprintf(w, "ingest: %d streams admitted (max %d), %d pending (max %d); CPU load %.2f of %.2f cores admission fills, a new stream ~%.2f",
		a.Admitted, a.MaxStreams, a.Pending, a.MaxPending, a.LoadCores, a.CapacityCores, a.StreamCost)
	if a.OverloadedFor > 0 {
		fmt.Fprintf(w, "; OVERLOADED for %v", a.OverloadedFor.Round(time.Second))
	}
	fmt.Fprintln(w)
	for _, m := range []struct {
		what string
		n    map[string]uint64
	}{{"refused", a.Refused}, {"ended", a.Ended}} {
		if len(m.n) == 0 {
			continue
		}
		keys := make([]string, 0, len(m.n))
		for k := range m.n {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(w, "  streams %s:", m.what)
		for _, k := range keys {
			fmt.Fprintf(w, " %s=%d", k, m.n[k])
		}
		fmt.Fprintln(w)
	}
	// The live streams: codec, size, layer, where from; a lost camera
	// loudly.
	for _, s := range a.Streams {
		parts := []string{s.App, s.State, s.Codec}
		if s.Width > 0 {
			parts = append(parts, fmt.Sprintf("%dx%d", s.Width, s.Height))
		}
		if s.Layer != "" {
			l := "layer " + s.Layer + " of " + strings.Join(s.Layers, ", ")
			if s.LayerDown > 0 {
				l += fmt.Sprintf(" (%d down: decoding behind or overloaded)", s.LayerDown)
			}
			parts = append(parts, l)
		}
		parts = append(parts, s.Source)
		if s.CameraLost > 0 {
			parts = append(parts, fmt.Sprintf("camera lost %d times", s.CameraLost))
		}
		fmt.Fprintf(w, "  stream %s: %s", s.ID, strings.Join(slices.DeleteFunc(parts, func(p string) bool { return p == "" }), ", "))
		if s.Waiting != "" {
			fmt.Fprintf(w, "; %s", loud(s.Waiting))
		}
		fmt.Fprintln(w)
	}
	// The cameras: one that is not streaming says why, loudly.
	for _, c := range a.Cameras {
		fmt.Fprintf(w, "  camera %s: %s, %s, %s", c.Name, c.App, c.Source, c.State)
		if c.Reconnects > 0 || c.CameraLost > 0 {
			fmt.Fprintf(w, ", %d reconnects, lost %d times", c.Reconnects, c.CameraLost)
		}
		if c.State != "streaming" && c.LastError != "" {
			fmt.Fprintf(w, "; DOWN %v: %s", c.Down.Round(time.Second), c.LastError)
		}
		fmt.Fprintln(w)
	}
}

// writeStatusTable prints sessions, modules, instances and the last re-plans.
func writeStatusTable(w io.Writer, st coordinator.Status) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, s := range st.Sessions {
		fmt.Fprintf(tw, "app %s: %d streams at %g fps, SLO %g ms, policy %s\n", s.App, s.Streams, s.FPS, s.SLOMS, st.Policy)
		fmt.Fprintf(tw, "  frames sent %d, finished %d, late %d, dropped %d, open %d; finish rate %.2f%% (last second %.2f%%)\n",
			s.Total.Sent, s.Total.Finished, s.Total.Late, s.Total.Dropped, s.Open, 100*s.FinishRateAll, 100*s.FinishRate)
		fmt.Fprintf(tw, "  latency p50 %.1f ms, p99 %.1f ms; cost $%.2f/h whole instances, $%.2f/h allocated\n", s.P50MS, s.P99MS, s.CostWhole, s.CostFractional)
		if s.IngestP95MS > 0 || s.IngestReserve > 0 {
			fmt.Fprintf(tw, "  ingest delay p95 %.1f ms (capture to the session; the plan reserves %.0f ms of the SLO for it)\n", s.IngestP95MS, s.IngestReserve)
		}
		if s.CriticalPath != "" {
			fmt.Fprintf(tw, "  critical path %s: %.1f ms planned\n", s.CriticalPath, s.CriticalMS)
		}
		if s.Degraded != "" {
			fmt.Fprintf(tw, "  DEGRADED (plan carries %.0f%% of the frames): %s\n", 100*s.Admitted, strings.TrimPrefix(s.Degraded, "degraded: "))
		}
		if len(s.Drops) > 0 {
			keys := make([]string, 0, len(s.Drops))
			for k := range s.Drops {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			fmt.Fprint(tw, "  drops:")
			for _, k := range keys {
				fmt.Fprintf(tw, " %s=%d", k, s.Drops[k])
			}
			fmt.Fprintln(tw)
		}
		fmt.Fprintln(tw, "  MODULE\tKIND\tIN/S\tSCALE\tEXEC MS\tBALLOON\tBATCH\tBUDGET MS\tINSTANCES\tDROPPED")
		for _, m := range s.Modules {
			fmt.Fprintf(tw, "  %s\t%s\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\t%d\t%d\n", m.Module, m.Kind, m.RateIn, m.Scale, m.ExecMS, m.Balloon, m.MeanBatch, m.BudgetMS, m.Instances, m.Dropped)
		}
		for _, m := range s.Modules {
			if st := m.State; st != nil {
				fmt.Fprintf(tw, "  state of %s: %d streams, migrations %d (pause p50 %.2f ms, p99 %.2f ms), restores %d, resets %d, failed moves %d\n",
					m.Module, st.Streams, st.Events["migrate"], st.PauseP50MS, st.PauseP99MS, st.Events["restore"], st.Events["reset"], st.Events["failed"])
			}
		}
	}
	fmt.Fprintln(tw, "INSTANCE\tTYPE\tSTATE\tMODULES")
	for _, in := range st.Instances {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", in.ID, in.Type, in.State, strings.Join(in.Modules, " "))
	}
	tw.Flush()
	if n := len(st.Replans); n > 0 {
		fmt.Fprintf(w, "last re-plans (%d shown):\n", min(n, 5))
		for _, r := range st.Replans[max(0, n-5):] {
			fmt.Fprintf(w, "  #%d %s: %s (moves: %d, $%.2f/h)\n", r.N, r.At.Format("15:04:05.000"), r.Trigger, len(r.Moves), r.CostWhole)
		}
	}
}
