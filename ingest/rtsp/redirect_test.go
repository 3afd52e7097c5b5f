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
