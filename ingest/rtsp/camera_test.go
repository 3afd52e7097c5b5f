package rtsp

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
)

func TestParseURL(t *testing.T) {
	cases := []struct {
		raw     string
		wantErr string // "" for valid
	}{
		{"rtsp://10.0.0.5:554/stream1", ""},
		{"rtsps://cam.local/live?channel=1", ""},
		{"RTSP://cam/x", ""},
		{"rtsp://user:p%40ss@cam:8554/x", ""},
		{"rtsp://[::1]:554/x", ""},
		{"", "missing: the camera's URL"},
		{"http://cam/x", `scheme "http": want rtsp:// or rtsps://`},
		{"cam.local/x", "no scheme"},
		{"rtsp:///x", "no host"},
		{"rtsp:cam", "no host"},
		{"rtsp://cam:0/x", `port "0": want 1..65535`},
		{"rtsp://cam:70000/x", `port "70000": want 1..65535`},
		{"rtsp://cam:x/x", "not a port number"},
		{"rtsp://cam/x#frag", "no #fragment"},
		{"rtsp://cam/a b", "no spaces"},
		{"rtsp://:pw@cam/x", "a password without a user"},
		// A raw '@' in the user information: refused, with the fix
		// (issue 43: it was accepted and authenticated).
		{"rtsp://admin:p@ss@cam/x", "rtsp:// URL (URL hidden: it may hold the password): an '@' in the user or password: write it percent-encoded as %40"},
		{"rtsps://ad@min:pw@cam:322/x", "rtsps:// URL (URL hidden: it may hold the password): an '@' in the user or password"},
		{"rtsp://ad@min@cam/x", "an '@' in the user or password: write it percent-encoded as %40"},
		{"rtsp://admin:p%40ss@cam/x", ""},
		{"rtsp://admin@cam/x", ""},
	}
	for _, c := range cases {
		t.Run(c.raw, func(t *testing.T) {
			_, err := ParseURL(c.raw)
			switch {
			case c.wantErr == "" && err != nil:
				t.Fatalf("ParseURL(%q): %v", c.raw, err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Fatalf("ParseURL(%q) = %v, want an error with %q", c.raw, err, c.wantErr)
			}
		})
	}
}

// TestParseURLErrorsHideThePassword: url.Parse quotes the whole URL in its
// errors; ParseURL's never hold the password.
func TestParseURLErrorsHideThePassword(t *testing.T) {
	for _, raw := range []string{
		"rtsp://admin:TopSecret9@cam:x/x",
		"rtsp://admin:TopSecret9@cam:0/x",
		"http://admin:TopSecret9@cam/x",
		"rtsp://admin:TopSecret9@cam/x#f",
		"rtsp://admin:TopSecret9@cam/a b",
		"rtsp://admin:TopSecret9@%zz/x",
		// A password holding '/', '?', '#' or '@' unencoded: the host
		// part ends early for url.Parse.
		"rtsp://admin:Top/Secret9@10.0.0.5/stream",
		"rtsp://admin:Top?Secret9@10.0.0.5/stream",
		"rtsp://admin:Top#Secret9@10.0.0.5/stream",
		"rtsp://admin:1234/TopSecret9@10.0.0.5/stream", // parses: host "admin:1234"
		"rtsp://admin:1234?TopSecret9@10.0.0.5/stream",
		"rtsp://admin:1234#TopSecret9@10.0.0.5/stream",
		"rtsp://admin:T@p/Secret9@10.0.0.5/stream",
		"rtsp://admin:Top@Secret9@10.0.0.5/stream", // parses: url.Parse takes the last '@'
		"rtsp://admin:Top/Secret9@10.0.0.5:x/stream",
		"rtsp://admin:Top/Secret9 @10.0.0.5/stream",
		"http://admin:Top/Secret9@10.0.0.5/stream",
	} {
		_, err := ParseURL(raw)
		if err == nil {
			t.Fatalf("ParseURL(%q): no error", raw)
		}
		for _, part := range []string{"Secret9", "admin", "Top", "1234"} {
			if strings.Contains(err.Error(), part) {
				t.Fatalf("ParseURL(%q): the error shows the user information (%q): %v", raw, part, err)
			}
		}
	}
}

// TestParseURLHidden: a URL with user information that does not parse, or
// whose host url.Parse and Redact disagree on, is not shown: the error
// names the scheme, what is wrong and that such a password must be
// percent-encoded; the percent-encoded form is accepted, with the host
// and password gortsplib needs.
// TestPasswordInline: a --camera with its password written out (visible in
// ps) is told apart from one that takes it from ${VAR} or has none.
func TestPasswordInline(t *testing.T) {
	for v, want := range map[string]bool{
		"rtsp://admin:secret@cam/x":              true,
		"door=rtsps://admin:secret@cam:322/x":    true,
		"rtsp://admin:${PW}@cam/x":               false,
		"rtsp://admin@cam/x":                     false,
		"rtsp://admin:@cam/x":                    false,
		"rtsp://cam/x?u=a@b":                     false,
		"rtsp://cam/x":                           false,
		"not a url":                              false,
		"door=rtsp://u:p%40ss@10.0.0.5:554/live": true,
	} {
		if got := PasswordInline(v); got != want {
			t.Errorf("PasswordInline(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestParseURLHidden(t *testing.T) {
	const hint = "a password holding '/', '?', '#' or '@' must be percent-encoded in a URL (RFC 3986: %2F, %3F, %23, %40)"
	cases := []struct{ raw, want string }{
		{"rtsp://admin:pa/ss@10.0.0.5/stream", "rtsp:// URL (URL hidden: it may hold the password): what follows the host's ':' is not a port number: " + hint},
		{"RTSPS://admin:pa?ss@10.0.0.5/stream", "rtsps:// URL (URL hidden: it may hold the password): what follows the host's ':' is not a port number: " + hint},
		{"rtsp://admin:12#ss@10.0.0.5/stream", "rtsp:// URL (URL hidden: it may hold the password): an '@' after the host part: " + hint},
		{"rtsp://admin:12/ss@10.0.0.5/stream", "rtsp:// URL (URL hidden: it may hold the password): an '@' after the host part: " + hint},
		{"rtsp://admin:pw@%zz/x", "rtsp:// URL (URL hidden: it may hold the password): a '%' not followed by two hex digits: " + hint},
		{"rtsp://cam:554/x@y", "rtsp:// URL (URL hidden: it may hold the password): an '@' after the host part: " + hint},
		{"1x://a:b/c@d", "camera URL (URL hidden: it may hold the password): "},
		{"rtsp://cam:x/x", "rtsp://cam:x/x: what follows the host's ':' is not a port number"}, // no '@': no password, shown
	}
	for _, c := range cases {
		t.Run(c.raw, func(t *testing.T) {
			_, err := ParseURL(c.raw)
			if err == nil || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("ParseURL(%q) = %v, want %q", c.raw, err, c.want)
			}
		})
	}
	u, err := ParseURL("rtsp://admin:pa%2Fss%3F%23%40@10.0.0.5/stream")
	if err != nil {
		t.Fatal(err)
	}
	if pw, _ := u.User.Password(); u.Host != "10.0.0.5" || pw != "pa/ss?#@" {
		t.Fatalf("host %q password %q", u.Host, pw)
	}
}

// TestRedactText: only the user information of the URLs in a text goes;
// every other byte stays, whatever the password (issue 43: the password
// replaced everywhere turned "wrong user or password" into "xxxxx user or
// password" and a URL's path /stream1 into /xxxxx beside a source= that
// still said /stream1, giving the password away by comparison).
func TestRedactText(t *testing.T) {
	cases := []struct{ in, want string }{
		{"camera door: rtsp://127.0.0.1:8554/stream1: 401 Unauthorized: wrong user or password in the URL",
			"camera door: rtsp://127.0.0.1:8554/stream1: 401 Unauthorized: wrong user or password in the URL"},
		{"DESCRIBE rtsp://admin:Hunter22@cam:554/x failed", "DESCRIBE rtsp://cam:554/x failed"},
		{`Get "rtsp://admin:wrong@127.0.0.1:8554/stream1": EOF`, `Get "rtsp://127.0.0.1:8554/stream1": EOF`},
		{"rtsp://admin:p%40ss@[::1]:554/x", "rtsp://[::1]:554/x"},
		{"rtsp://admin:pa%2Fss@cam/x?q=a@b", "rtsp://cam/x?q=a@b"},
		{"rtsp://admin@cam/x", "rtsp://cam/x"},
		{"from rtsp://a:b@h1/x to rtsps://c:d@h2:322/y", "from rtsp://h1/x to rtsps://h2:322/y"},
		{"rtsp://a:b@h1 and rtsp://h2/x", "rtsp://h1 and rtsp://h2/x"},
		{"rtsp://admin:it's(ok)!*@cam", "rtsp://cam"},
		{"rtsp://cam/x: ask admin@example.com", "rtsp://cam/x: ask admin@example.com"},
		{"rtsp://cam:554 user@example.com", "rtsp://cam:554 user@example.com"},
		{"no URL: user admin, password stream1", "no URL: user admin, password stream1"},
		{"", ""},
		{"://", "://"},
		{"x://u:p@", "x://"},
	}
	for _, c := range cases {
		if got := RedactText(c.in); got != c.want {
			t.Errorf("RedactText(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestCameraErrorsRedactOnlyUserinfo: a camera's errors show its URL
// without user information and every other word as it is, whatever the
// password is a substring of: a library error quoting the URL with its
// password loses the user information, not the password's other
// occurrences.
func TestCameraErrorsRedactOnlyUserinfo(t *testing.T) {
	for _, pw := range []string{"wrong", "stream1", "Unauthorized", "127.0.0.1", "camera", "door", "8554", "rtsp"} {
		t.Run(pw, func(t *testing.T) {
			c := &camera{cfg: Camera{Name: "door", URL: "rtsp://admin:" + pw + "@127.0.0.1:8554/stream1", App: "app"}}
			cases := []struct {
				err  error
				want string
			}{
				{c.errorf("401 Unauthorized: wrong user or password in the URL"),
					"camera door: rtsp://127.0.0.1:8554/stream1: 401 Unauthorized: wrong user or password in the URL"},
				{c.errorf("DESCRIBE: %v", fmt.Errorf("request to %s failed: EOF", c.cfg.URL)),
					"camera door: rtsp://127.0.0.1:8554/stream1: DESCRIBE: request to rtsp://127.0.0.1:8554/stream1 failed: EOF"},
			}
			for _, tc := range cases {
				if tc.err.Error() != tc.want {
					t.Errorf("password %q: %q, want %q", pw, tc.err, tc.want)
				}
			}
		})
	}
}

func TestRedact(t *testing.T) {
	cases := []struct{ raw, want string }{
		{"rtsp://u:p@cam:554/x", "rtsp://cam:554/x"},
		{"rtsp://cam/x", "rtsp://cam/x"},
		{"rtsp://u:p@ss@cam/x", "rtsp://cam/x"},
		{"rtsp://u:p@ss@cam/x?a=b@c", "rtsp://c"}, // over-redacted: ParseURL refuses it
		{"rtsp://u@cam/x", "rtsp://cam/x"},
		{"u:p@cam/x", "cam/x"},
		{"rtsp://cam/x@y", "rtsp://cam/x@y"},
		// A password holding '/', '?', '#' or '@': cut at the last '@'.
		{"rtsp://admin:pa/ss@10.0.0.5/stream", "rtsp://10.0.0.5/stream"},
		{"rtsp://admin:pa?ss@10.0.0.5/stream", "rtsp://10.0.0.5/stream"},
		{"rtsp://admin:pa#ss@10.0.0.5/stream", "rtsp://10.0.0.5/stream"},
		{"rtsp://admin:p@a/ss@10.0.0.5/stream", "rtsp://10.0.0.5/stream"},
		{"admin:pa/ss@cam/x", "cam/x"},
		// A ':' before the last '@' may be a password: over-redacted.
		{"rtsp://cam:554/x@y", "rtsp://y"},
		{"rtsp://us@er/x@y", "rtsp://er/x@y"},
		{"", ""},
	}
	for _, c := range cases {
		if got := Redact(c.raw); got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.raw, got, c.want)
		}
	}
}

func TestParseFlag(t *testing.T) {
	cases := []struct {
		v, name, url, wantErr string
	}{
		{v: "rtsp://10.0.0.5/stream1", name: "10-0-0-5-stream1", url: "rtsp://10.0.0.5/stream1"},
		{v: "rtsp://cam.local:554/Live/Main", name: "cam-local-live-main", url: "rtsp://cam.local:554/Live/Main"},
		{v: "rtsp://cam:8554/x", name: "cam-8554-x", url: "rtsp://cam:8554/x"},
		{v: "rtsp://cam", name: "cam", url: "rtsp://cam"},
		{v: "door=rtsp://u:p@cam/x", name: "door", url: "rtsp://u:p@cam/x"},
		{v: "rtsp://cam/x?user=a=b", name: "cam-x", url: "rtsp://cam/x?user=a=b"},
		{v: "Door=rtsp://cam/x", wantErr: "name"},
		{v: "door=", wantErr: "missing"},
		{v: "door=http://cam/x", wantErr: "want rtsp://"},
		{v: "", wantErr: "missing"},
		{v: "door=rtsp://admin:pa/ss123@cam/x", wantErr: "--camera: rtsp:// URL (URL hidden: it may hold the password)"},
		{v: "rtsp://admin:pa?ss123@cam/x", wantErr: "must be percent-encoded"},
		{v: "Door=rtsp://admin:pa#ss123@cam/x", wantErr: "--camera Door=rtsp://cam/x: name"},
		{v: "door=rtsp://admin:pa%2Fss123@cam/x", name: "door", url: "rtsp://admin:pa%2Fss123@cam/x"},
		{v: "door=rtsp://admin:p@ss123@cam/x", wantErr: "--camera: rtsp:// URL (URL hidden: it may hold the password): an '@' in the user or password: write it percent-encoded as %40"},
		{v: "door=rtsp://admin:p%40ss123@cam/x", name: "door", url: "rtsp://admin:p%40ss123@cam/x"},
		{v: "door=rtsp://admin:${MDAG_TEST_CAM_PASSWORD}@cam/x", name: "door", url: "rtsp://admin:s3cret-ss123@cam/x"},
		{v: "door=rtsp://admin:${MDAG_TEST_CAM_UNSET}@cam/x", wantErr: "${MDAG_TEST_CAM_UNSET} is not set"},
	}
	t.Setenv("MDAG_TEST_CAM_PASSWORD", "s3cret-ss123")
	for _, c := range cases {
		t.Run(c.v, func(t *testing.T) {
			cam, err := ParseFlag(c.v, "traffic", 5)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("ParseFlag(%q) = %+v, %v; want an error with %q", c.v, cam, err, c.wantErr)
				}
				if strings.Contains(err.Error(), "ss123") {
					t.Fatalf("ParseFlag(%q): the error shows the password: %v", c.v, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cam.Name != c.name || cam.URL != c.url || cam.App != "traffic" || cam.FPS != 5 {
				t.Fatalf("ParseFlag(%q) = %+v, want name %q url %q", c.v, cam, c.name, c.url)
			}
			if err := Check([]Camera{cam}, []string{"traffic"}); err != nil {
				t.Fatalf("Check(ParseFlag(%q)): %v", c.v, err)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	ok := Camera{Name: "a", URL: "rtsp://cam/x", App: "traffic"}
	with := func(f func(c *Camera)) Camera { c := ok; f(&c); return c }
	cases := []struct {
		name    string
		cams    []Camera
		wantErr string
	}{
		{"valid", []Camera{ok, with(func(c *Camera) { c.Name = "b"; c.Transport = "udp" })}, ""},
		{"duplicate", []Camera{ok, ok}, "camera a: two cameras have this name"},
		{"bad name", []Camera{with(func(c *Camera) { c.Name = "-a" })}, "camera -a: name"},
		{"bad url", []Camera{with(func(c *Camera) { c.URL = "rtmp://x:pw@cam" })}, `camera a: rtmp://cam: scheme "rtmp"`},
		{"no app", []Camera{with(func(c *Camera) { c.App = "" })}, "camera a: no app"},
		{"unknown app", []Camera{with(func(c *Camera) { c.App = "face" })}, `camera a: app "face" is not deployed (deployed: traffic)`},
		{"fps", []Camera{with(func(c *Camera) { c.FPS = -1 })}, "camera a: fps -1"},
		{"transport", []Camera{with(func(c *Camera) { c.Transport = "sctp" })}, `camera a: transport "sctp"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Check(c.cams, []string{"traffic"})
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("Check: %v, want %q", err, c.wantErr)
			}
		})
	}
}

// FuzzParseFlag: any --camera value is parsed or refused without a panic;
// an error never shows the password; what parses passes Check and its
// Source has no user information.
func FuzzParseFlag(f *testing.F) {
	for _, s := range []string{"rtsp://cam/x", "door=rtsp://u:p@cam:554/x", "rtsp://u:p@[::1]:8554/a/b?c", "x=", "=rtsp://c", "rtsp://u:p@c:99999/", "rtsps://u:p@c/%zz",
		"door=rtsp://admin:pa/ss123@cam/x", "rtsp://admin:pa?ss123@cam/x", "rtsp://admin:pa#ss123@cam/x", "rtsp://admin:12/ss123@cam/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		cam, err := ParseFlag(v, "app", 0)
		for _, pw := range passwordsOf(strings.TrimPrefix(v, v[:max(0, strings.Index(v, "=")+1)])) {
			if len(pw) >= 4 && err != nil && strings.Contains(err.Error(), pw) && !strings.Contains(Redact(v), pw) {
				// Unless the message says it anyway ("pass" in "password"):
				// the error with the password replaced holds it too.
				_, other := ParseFlag(strings.ReplaceAll(v, pw, strings.Repeat("Q", len(pw))), "app", 0)
				if other == nil || !strings.Contains(other.Error(), pw) {
					t.Fatalf("ParseFlag(%q): the error shows the password %q: %v", v, pw, err)
				}
			}
		}
		if err != nil {
			return
		}
		if err := Check([]Camera{cam}, []string{"app"}); err != nil {
			t.Fatalf("ParseFlag(%q) = %+v, which Check refuses: %v", v, cam, err)
		}
		if u, _ := ParseURL(cam.URL); u != nil && u.User != nil && strings.Contains(cam.Source(), "@"+u.Host) {
			t.Fatalf("Source %q keeps the user information of %q", cam.Source(), cam.URL)
		}
	})
}

// passwordsOf is what FuzzParseFlag's errors must not show of a URL: its
// password as written, decoded and encoded, whether or not the URL parses
// (the user information ends where Redact cuts it).
func passwordsOf(raw string) []string {
	var out []string
	add := func(p string) {
		if p == "" {
			return
		}
		for _, v := range []string{p, url.QueryEscape(p), url.PathEscape(p)} {
			if !contains(out, v) {
				out = append(out, v)
			}
		}
		if dec, err := url.PathUnescape(p); err == nil && dec != "" && !contains(out, dec) {
			out = append(out, dec)
		}
	}
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			add(p)
		}
	}
	from := 0
	if i := strings.Index(raw, "://"); i >= 0 {
		from = i + 3
	}
	if at := userinfoEnd(raw[from:]); at >= 0 {
		if _, pass, ok := strings.Cut(raw[from:from+at], ":"); ok {
			add(pass)
		}
	}
	return out
}
