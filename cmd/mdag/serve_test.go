package main

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mdag/mdag/internal/engine"
)

// TestServeSynthetic runs the embedded server with synthetic streams for
// two seconds: every frame is accounted for in the summary it prints.
func TestServeSynthetic(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 2 s of live streams")
	}
	var out, errb bytes.Buffer
	code := run(strings.Fields("serve --example traffic --synthetic 2 --duration 2s --listen 127.0.0.1:0"), &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"app traffic: 2 streams", "frames sent", "detect", "INSTANCE", "last re-plans"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(out.String(), "open 0;") {
		t.Errorf("frames left open at exit:\n%s", out.String())
	}
}

func TestStatusCommand(t *testing.T) {
	e := engine.New(engine.Config{})
	e.Start()
	defer e.Close()
	srv := httptest.NewServer(statusHandler(e))
	defer srv.Close()
	var out, errb bytes.Buffer
	if code := run([]string{"status", "--server", srv.URL, "-o", "json"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var st engine.Status
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		t.Fatalf("json: %v\n%s", err, out.String())
	}
	if st.Policy != string(engine.DefaultPolicy) {
		t.Errorf("policy %q", st.Policy)
	}
	out.Reset()
	if code := run([]string{"status", "--server", srv.URL}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "INSTANCE") {
		t.Fatalf("table: exit %d:\n%s", code, out.String())
	}
	if code := run([]string{"status", "--server", srv.URL + "/nothing-here"}, &out, &errb); code != exitFailure ||
		!strings.Contains(errb.String(), "404") {
		t.Errorf("a wrong URL: exit %d, %q", code, errb.String())
	}
}
