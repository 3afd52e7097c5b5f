package rtsp

import (
	"bufio"
	"fmt"
	"net"
	"net/textproto"
	"strings"
	"testing"
	"time"
)

// answerer serves RTSP on a loopback port: OPTIONS is 200, DESCRIBE is
// describe's answer (status line and headers after CSeq, then the body);
// it returns the port. The test's cleanup closes it.
func answerer(t *testing.T, describe func(port int) (head, body string)) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				tp := textproto.NewReader(bufio.NewReader(c))
				for {
					reqLine, err := tp.ReadLine()
					if err != nil {
						return
					}
					h, err := tp.ReadMIMEHeader()
					if err != nil {
						return
					}
					if strings.HasPrefix(reqLine, "OPTIONS ") {
						fmt.Fprintf(c, "RTSP/1.0 200 OK\r\nCSeq: %s\r\nPublic: DESCRIBE, SETUP, PLAY, TEARDOWN\r\n\r\n", h.Get("Cseq"))
						continue
					}
					status, body := describe(port)
					first, rest, _ := strings.Cut(status, "\r\n")
					fmt.Fprintf(c, "%s\r\nCSeq: %s\r\n%sContent-Length: %d\r\n\r\n%s", first, h.Get("Cseq"), rest, len(body), body)
				}
			}(c)
		}
	}()
	return port
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// TestCameraNeverConnectedDown: a camera that never connected (a wrong
// password, a path the camera does not serve, no H.264 or H.265, nothing
// listening) is down since its first connection attempt, on the injected
// clock (issue 43: status said "DOWN 0s" after 5, 8 and 40 s, and
// /v1/ingest had no down time for it). Its error shows the URL without
// user information and every other word as it is, whatever the password
// (issue 43: the password "wrong" turned "wrong user or password" into
// "xxxxx user or password", and "stream1" the path /stream1 into /xxxxx
// beside a source= that still said /stream1).
func TestCameraNeverConnectedDown(t *testing.T) {
	unauthorized := func(int) (string, string) {
		return "RTSP/1.0 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"cam\"\r\n", ""
	}
	notFound := func(int) (string, string) { return "RTSP/1.0 404 Not Found\r\n", "" }
	mjpeg := func(port int) (string, string) {
		return fmt.Sprintf("RTSP/1.0 200 OK\r\nContent-Type: application/sdp\r\nContent-Base: rtsp://127.0.0.1:%d/stream1/\r\n", port),
			"v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=cam\r\nc=IN IP4 0.0.0.0\r\nt=0 0\r\nm=video 0 RTP/AVP 26\r\na=control:trackID=0\r\n"
	}
	cases := []struct {
		name     string
		describe func(int) (string, string) // nil: nothing listens
		userinfo string
		state    State
		want     string // the last error after "camera door: rtsp://127.0.0.1:PORT/stream1: "
	}{
		{"wrong password", unauthorized, "admin:wrong", Reconnecting, "401 Unauthorized: wrong user or password in the URL"},
		{"password is the path", unauthorized, "admin:stream1", Reconnecting, "401 Unauthorized: wrong user or password in the URL"},
		{"password is the host", unauthorized, "admin:127.0.0.1", Reconnecting, "401 Unauthorized: wrong user or password in the URL"},
		{"404", notFound, "admin:Found", Reconnecting, "404 Not Found: no such stream path"},
		{"mjpeg", mjpeg, "", Failed, "offers no H.264 or H.265 video (it has: video M-JPEG)"},
		{"nothing listens", nil, "admin:connect", Reconnecting, "DESCRIBE: dial tcp 127.0.0.1:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var port int
			if tc.describe != nil {
				port = answerer(t, tc.describe)
			} else {
				port = closedPort(t)
			}
			ui := tc.userinfo
			if ui != "" {
				ui += "@"
			}
			r := startRig(t, []Camera{{Name: "door", URL: fmt.Sprintf("rtsp://%s127.0.0.1:%d/stream1", ui, port), App: "app", Transport: "tcp"}}, Options{})
			source := fmt.Sprintf("rtsp://127.0.0.1:%d/stream1", port)
			want := "camera door: " + source + ": " + tc.want
			r.feeds.waitFor(t, 20*time.Second, "the first attempt to fail", func() bool {
				s := r.status("door")
				return s.State == tc.state && s.LastError != "" && (tc.state == Failed || !s.NextRetry.IsZero())
			})
			s := r.status("door")
			if !strings.HasPrefix(s.LastError, want) {
				t.Fatalf("last error %q, want %q", s.LastError, want)
			}
			if s.Source != source || s.Down != 0 {
				t.Fatalf("source %q, down %v; want %q, 0 (the clock has not moved)", s.Source, s.Down, source)
			}
			for i, d := range []time.Duration{5 * time.Second, 3 * time.Second, 32 * time.Second} {
				r.clk.Advance(d)
				want := []time.Duration{5 * time.Second, 8 * time.Second, 40 * time.Second}[i]
				if s := r.status("door"); s.Down != want || s.State == Streaming || s.Connects != 0 {
					t.Fatalf("after %v: down %v (state %s, connects %d), want %v: down since the first attempt", want, s.Down, s.State, s.Connects, want)
				}
			}
			r.m.Close()
			if log := r.log.String(); strings.Contains(log, "xxxxx") || !strings.Contains(log, "source="+source) ||
				(tc.userinfo != "" && strings.Contains(log, tc.userinfo)) {
				t.Fatalf("the log rewrites text, lacks source=%s or shows the user information:\n%s", source, log)
			}
		})
	}
}
