package main

import (
	"bytes"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/mdag/mdag/examples"
)

// TestAllowOriginFlag: --allow-origin, repeated or comma-separated, lets
// those pages call WHIP from a browser and no others; "*" is allowed but
// warned about; a malformed origin is refused at parse time.
func TestAllowOriginFlag(t *testing.T) {
	app, _, err := examples.Parse("traffic")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		args    []string
		parse   string   // a parse error containing this; "" none
		allowed []string // origins that get CORS headers
		refused []string
		warn    bool
	}{
		{"default: own pages only", nil, "", nil, []string{"https://a.example"}, false},
		{"repeated", []string{"--allow-origin", "https://a.example", "--allow-origin", "http://b.example:8080"}, "",
			[]string{"https://a.example", "http://b.example:8080"}, []string{"https://c.example", "http://b.example"}, false},
		{"comma-separated", []string{"--allow-origin", "https://a.example, http://b.example:8080"}, "",
			[]string{"https://a.example", "http://b.example:8080"}, []string{"https://c.example"}, false},
		{"any", []string{"--allow-origin", "*"}, "", []string{"https://a.example", "null"}, nil, true},
		{"malformed", []string{"--allow-origin", "a.example"}, "want scheme://host", nil, nil, false},
		{"with a path", []string{"--allow-origin", "https://a.example/app"}, "want scheme://host", nil, nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			wf := addWhipFlags(fs)
			err := fs.Parse(c.args)
			if c.parse != "" {
				if err == nil || !strings.Contains(err.Error(), c.parse) {
					t.Fatalf("parse: %v, want an error saying %q", err, c.parse)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			srv, err := wf.server("serve", "127.0.0.1:0", app, nil, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			if got := strings.Contains(logs.String(), "level=WARN msg=\"--allow-origin *"); got != c.warn {
				t.Errorf("warning about * logged: %v, want %v:\n%s", got, c.warn, logs.String())
			}
			for _, o := range append(append([]string{}, c.allowed...), c.refused...) {
				req := httptest.NewRequest(http.MethodGet, "/v1/streams", nil)
				req.Header.Set("Origin", o)
				w := httptest.NewRecorder()
				srv.Handler().ServeHTTP(w, req)
				ok := w.Code == 200 && w.Header().Get("Access-Control-Allow-Origin") != ""
				if want := !slices.Contains(c.refused, o); ok != want {
					t.Errorf("origin %q: %d, Access-Control-Allow-Origin %q; allowed: want %v", o, w.Code, w.Header().Get("Access-Control-Allow-Origin"), want)
				}
			}
		})
	}
}
