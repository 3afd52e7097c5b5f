package rtsp

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/bluenviron/gortsplib/v4/pkg/base"
)

// redirector answers OPTIONS on ln with 200 and every other request with
// 302 to location, and reports each redirected request's Authorization.
func redirector(t *testing.T, ln net.Listener, location func() string, auths chan<- string) {
	t.Helper()
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
					select {
					case auths <- h.Get("Authorization"):
					default:
					}
					fmt.Fprintf(c, "RTSP/1.0 302 Found\r\nCSeq: %s\r\nLocation: %s\r\n\r\n", h.Get("Cseq"), location())
				}
			}(c)
		}
	}()
}

// TestCameraRedirectElsewhereRefused: a camera that redirects DESCRIBE to
// another host does not make mdag connect there, and its user:password
// never leaves for it (issue 36 finding 7: gortsplib followed the redirect
// and sent Basic admin:... to the target); the status says why.
func TestCameraRedirectElsewhereRefused(t *testing.T) {
	t.Parallel()
	camLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer camLn.Close()
	// the redirect's target: another loopback address (Linux routes 127/8)
	evil, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	defer evil.Close()
	reached := make(chan string, 8)
	go func() {
		for {
			c, err := evil.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			reached <- line
			c.Close()
		}
	}()
	auths := make(chan string, 8)
	redirector(t, camLn, func() string { return "rtsp://" + evil.Addr().String() + "/stolen" }, auths)
	url := "rtsp://admin:s3cret@" + camLn.Addr().String() + "/live"
	r := startRig(t, []Camera{{Name: "door", URL: url, App: "app"}}, Options{})
	r.feeds.waitFor(t, 20*time.Second, "the redirect's refusal", func() bool {
		return strings.Contains(r.status("door").LastError, "redirected to")
	})
	s := r.status("door")
	if !strings.Contains(s.LastError, "redirected to "+evil.Addr().String()) || strings.Contains(s.LastError, "s3cret") {
		t.Fatalf("last error %q: want the redirect named, no password", s.LastError)
	}
	select {
	case line := <-reached:
		t.Fatalf("the redirect's target was connected to (%q)", line)
	default:
	}
}

// TestCameraRedirectLoopBounded: redirects to the camera's own address
// are followed at most MaxRedirects times (gortsplib recurses without
// bound).
func TestCameraRedirectLoopBounded(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	auths := make(chan string, 64)
	redirector(t, ln, func() string { return "rtsp://" + ln.Addr().String() + "/again" }, auths)
	r := startRig(t, []Camera{{Name: "loop", URL: "rtsp://" + ln.Addr().String() + "/live", App: "app"}}, Options{})
	r.feeds.waitFor(t, 20*time.Second, "the redirect loop's end", func() bool {
		return strings.Contains(r.status("loop").LastError, fmt.Sprintf("more than %d redirects", MaxRedirects))
	})
	// the first DESCRIBE and the redirects the dial bound lets through
	// (it also allows one re-dial for UDP giving way to TCP)
	if n := len(auths); n != MaxRedirects+2 {
		t.Fatalf("%d requests in the first attempt, want %d", n, MaxRedirects+2)
	}
}

// TestRTSPSRedirectNotFollowed (review): an rtsps:// camera runs over TCP
// from its first dial, so a second dial is a redirect, and the dial cannot
// tell one to rtsp:// (the credentials in plaintext) at the same address:
// refused; an rtsp:// camera's second dial to itself goes through.
func TestRTSPSRedirectNotFollowed(t *testing.T) {
	dialed := 0
	dial := func(context.Context, string, string) (net.Conn, error) { dialed++; return nil, nil }
	var c camera
	for _, tc := range []struct {
		url     string
		second  bool // the second dial goes through
		wantErr string
	}{
		{"rtsps://cam:322/x", false, "redirects are not followed"},
		{"rtsp://cam/x", true, ""},
	} {
		u, err := base.ParseURL(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		d := c.dialOnly(u, dial)
		addr := canonical(u)
		if _, err := d(context.Background(), "tcp", addr); err != nil {
			t.Fatalf("%s: first dial: %v", tc.url, err)
		}
		_, err = d(context.Background(), "tcp", addr)
		if tc.second && err != nil || !tc.second && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Fatalf("%s: second dial: %v", tc.url, err)
		}
	}
	if dialed != 3 {
		t.Fatalf("%d dials reached the network, want 3", dialed)
	}
}

func canonical(u *base.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"rtsp": "554", "rtsps": "322"}[u.Scheme]
	}
	return net.JoinHostPort(u.Hostname(), port)
}
