package whip

import (
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"time"

	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/internal/auth"
)

//go:embed static
var embedded embed.FS

// staticFS serves /static/... from the embedded files (no CDN).
var staticFS fs.FS = embedded

var pageTmpl = template.Must(template.ParseFS(embedded, "static/stream.html"))

func (s *Server) handlePage(w http.ResponseWriter, r *http.Request) {
	app := r.PathValue("app")
	if _, ok := s.cfg.Apps[dag.AppID(app)]; !ok {
		httpError(w, http.StatusNotFound, fmt.Sprintf("unknown app %q (deployed: %s)", app, s.appList()))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = pageTmpl.Execute(w, map[string]any{"App": app, "Open": s.Open(), "Media": string(s.mediaOf(dag.AppID(app)))})
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request) {
	if !s.cors(w, r) || !s.apiAllowed(w, r, true) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.Streams())
}

// handleAdmission serves the admission state; it is counts only, so in
// the simple form (--token-file) it needs no token; with a tokens file it
// needs an api token, like /v1/status.
func (s *Server) handleAdmission(w http.ResponseWriter, r *http.Request) {
	if !s.cors(w, r) || !s.apiAllowed(w, r, false) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.Admission())
}

// sseKeepAlive is how often an idle results stream gets a comment line, so
// proxies keep the connection.
const sseKeepAlive = 15 * time.Second

// SSEWriteTimeout bounds one event's write to a results stream (a
// variable for tests): a subscriber that stops reading is cut off then.
var SSEWriteTimeout = 10 * time.Second

// OfferReadTimeout bounds reading a WHIP offer's body (a variable for
// tests); the HTTP server bounds its headers.
var OfferReadTimeout = 10 * time.Second

// handleResults streams a stream's results as Server-Sent Events: event
// "result" (data: Result JSON, id: the frame number) per frame, "end"
// (data: why) when the stream ends.
//
// It needs an api token or an ingest token for the stream's app; a valid
// token for another app gets the same 404 as a stream that does not exist.
func (s *Server) handleResults(w http.ResponseWriter, r *http.Request) {
	var tok *auth.Token
	if !s.cors(w, r) || !s.allowed(w, r, true, func(t *auth.Token) bool { tok = t; return t.Has(auth.API) || t.Has(auth.Ingest) }) {
		return
	}
	st := s.lookup(r.PathValue("id"))
	if st != nil && tok != nil && !tok.Has(auth.API) && !tok.MayStream(string(st.app)) {
		st = nil
	}
	if st == nil {
		httpError(w, http.StatusNotFound, fmt.Sprintf("no live stream %q", r.PathValue("id")))
		return
	}
	ch, unsub, ok := st.subscribe(subEvents)
	if !ok {
		httpError(w, http.StatusTooManyRequests, fmt.Sprintf("stream %q has %d result subscribers, the most it takes: close one first", st.id, MaxSubscribers))
		return
	}
	defer unsub()
	rc := http.NewResponseController(w)
	// send writes one event within SSEWriteTimeout: a client that stops
	// reading fills its socket's buffers and is cut off then, rather than
	// holding this goroutine and its subscription for ever
	send := func(format string, a ...any) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(SSEWriteTimeout))
		if _, err := fmt.Fprintf(w, format, a...); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if !send(": mdag results for stream %s\n\n", st.id) {
		return
	}
	keepAlive := s.clk.After(sseKeepAlive) // one timer at a time, not one per result
	for {
		select {
		case res := <-ch:
			b, _ := json.Marshal(res)
			if !send("id: %d\nevent: result\ndata: %s\n\n", res.Frame, b) {
				st.c.resultsDropped.Add(1) // the reader went away or stopped reading
				return
			}
			st.c.resultsSent.Add(1)
		case <-st.done:
			st.mu.Lock()
			why := st.ended
			st.mu.Unlock()
			send("event: end\ndata: %s\n\n", jsonString(why))
			return
		case <-r.Context().Done():
			return
		case <-keepAlive:
			keepAlive = s.clk.After(sseKeepAlive)
			if !send(": keep-alive\n\n") {
				return
			}
		}
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
