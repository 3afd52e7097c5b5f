package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mdag/mdag/internal/auth"
	"github.com/mdag/mdag/internal/browsertest"
)

// browserAccept is what Chromium sends when it opens a page.
const browserAccept = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8"

// TestDashboardSignIn: with --tokens a browser opening / without a valid
// api token gets 401 with the sign-in page (text/html, how to create an
// api token, a field for it; no data; the same page whatever was wrong);
// a program (curl, mdag status) gets the plain 401 as before; a valid
// token in ?access_token= or the header (what the page's script sends)
// gets the dashboard. The dashboard's data stays plain 401 for browsers
// too: the page is only the dashboard's own.
func TestDashboardSignIn(t *testing.T) {
	obs := startTestObserved(t, testTokens(t))
	h := obs.handler()
	get := func(path, accept, header string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", path, nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	var page string
	for _, c := range []struct{ name, path, header string }{
		{"no token", "/", ""},
		{"unknown token in the query", "/?access_token=nope-nope-nope-nope", ""},
		{"ingest token in the query", "/?access_token=" + testIngestToken, ""},
		{"empty token in the query", "/?access_token=", ""},
		{"unknown token in the header", "/", "Bearer nope-nope-nope-nope"},
		{"ingest token in the header", "/", "Bearer " + testIngestToken},
	} {
		w := get(c.path, browserAccept, c.header)
		if w.Code != http.StatusUnauthorized || w.Header().Get("WWW-Authenticate") != `Bearer realm="mdag"` ||
			w.Header().Get("Content-Type") != "text/html; charset=utf-8" {
			t.Fatalf("browser, %s: %d %v", c.name, w.Code, w.Header())
		}
		for _, want := range []string{"needs an api token", "mdag token new --role api --name NAME",
			`<form id="signin"`, `name="access_token" type="password"`, `<script src="/dashboard/signin.js">`} {
			if !strings.Contains(w.Body.String(), want) {
				t.Errorf("browser, %s: the page lacks %q", c.name, want)
			}
		}
		for _, k := range []string{"Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options"} {
			if w.Header().Get(k) == "" {
				t.Errorf("browser, %s: no %s", c.name, k)
			}
		}
		// no data: not the app, the instances, the token names or the dashboard's markup
		for _, bad := range []string{"traffic", "ops", "cam", `id="apps"`, "/dashboard/app.js"} {
			if strings.Contains(w.Body.String(), bad) {
				t.Errorf("browser, %s: the page holds %q", c.name, bad)
			}
		}
		if page == "" {
			page = w.Body.String()
		} else if w.Body.String() != page {
			t.Errorf("browser, %s: a page unlike another refusal's", c.name)
		}
	}
	for _, accept := range []string{"", "*/*", "application/json"} {
		for _, path := range []string{"/", "/?access_token=nope-nope-nope-nope"} {
			w := get(path, accept, "")
			if w.Code != http.StatusUnauthorized || w.Header().Get("WWW-Authenticate") != `Bearer realm="mdag"` ||
				strings.TrimSpace(w.Body.String()) != auth.UnauthorizedBody {
				t.Errorf("program (Accept %q) GET %s: %d %v %q, want the plain 401", accept, path, w.Code, w.Header(), w.Body.String())
			}
		}
	}
	for _, path := range []string{"/v1/dashboard", "/v1/thumbs/s1"} {
		if w := get(path, browserAccept, ""); w.Code != http.StatusUnauthorized || strings.TrimSpace(w.Body.String()) != auth.UnauthorizedBody {
			t.Errorf("browser GET %s: %d %q, want the plain 401", path, w.Code, w.Body.String())
		}
	}
	for _, c := range []struct{ path, accept, header string }{
		{"/?access_token=" + testAPIToken, browserAccept, ""},
		{"/", browserAccept, "Bearer " + testAPIToken},
		{"/", "*/*", "Bearer " + testAPIToken}, // the sign-in page's fetch
	} {
		w := get(c.path, c.accept, c.header)
		if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `<script src="/dashboard/app.js">`) {
			t.Errorf("GET %s (Accept %q, %q): %d %.100q, want the dashboard", c.path, c.accept, c.header, w.Code, w.Body.String())
		}
	}
	// Without --tokens the dashboard is open as before.
	open := startTestObserved(t, nil).handler()
	w := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("Accept", browserAccept)
	open.ServeHTTP(w, req)
	if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `<script src="/dashboard/app.js">`) {
		t.Errorf("open: %d, want the dashboard", w.Code)
	}
}

// TestDashboardSignInBrowser: headless Chromium opens / under --tokens,
// gets the sign-in page, is refused a wrong token, then types the api
// token and sees the live dashboard, the token nowhere in the URL; a
// reload (the token kept in the tab) comes back to the dashboard. No
// script error or CSP violation on the way.
func TestDashboardSignInBrowser(t *testing.T) {
	obs := startTestObserved(t, testTokens(t))
	srv := httptest.NewServer(obs.handler())
	t.Cleanup(srv.Close)
	ctx := browsertest.New(t, 40*time.Second)
	if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		problems []string
	)
	cctx, stopConsole := context.WithCancel(ctx)
	consoleDone := make(chan struct{})
	msgs := chromedp.Console(cctx)
	go func() {
		defer close(consoleDone)
		for m, err := range msgs {
			if err != nil {
				return
			}
			// the refusals themselves are logged by the network ("Failed to
			// load resource: ... 401"): expected here
			if (m.Type == chromedp.ConsoleError && m.Source != "network") || m.IsException() {
				mu.Lock()
				problems = append(problems, m.String()+" at "+m.URL)
				mu.Unlock()
			}
		}
	}()
	poll := func(what, expr string) {
		t.Helper()
		var err error
		for try := 0; try < 3; try++ {
			_, err = chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(15*time.Second)))
			// just after a navigation chromedp can still hold the old page's context
			if err == nil || !strings.Contains(err.Error(), "Cannot find context") {
				break
			}
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	poll("the sign-in form", `!!document.querySelector("#signin #token")`)
	if err := chromedp.Do(ctx,
		chromedp.SendKeys("#token", "nope-nope-nope-nope"),
		chromedp.Click(`#signin button[type="submit"]`),
	); err != nil {
		t.Fatal(err)
	}
	poll("the refusal", `document.getElementById("signin-msg").textContent.includes("did not accept")`)
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("token").value = ""; true`)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys("#token", testAPIToken+"\r")); err != nil {
		t.Fatal(err)
	}
	live := `document.getElementById("conn") && document.getElementById("conn").textContent === "live" && !!document.querySelector("[data-chart]")`
	poll("the live dashboard", live)
	check := func(when string) {
		t.Helper()
		href, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href`))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(href, "access_token") || strings.Contains(href, testAPIToken) {
			t.Errorf("%s: the token is in the URL: %s", when, href)
		}
		kept, err := chromedp.Run(ctx, chromedp.Evaluate[string](`sessionStorage.getItem("mdag.access_token")`))
		if err != nil || kept != testAPIToken {
			t.Errorf("%s: sessionStorage holds %q (%v)", when, kept, err)
		}
	}
	check("signed in")
	if err := chromedp.Do(ctx, chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	poll("the dashboard after a reload", live)
	check("reloaded")
	stopConsole()
	<-consoleDone
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("the page logged errors:\n%s", strings.Join(problems, "\n"))
	}
}
