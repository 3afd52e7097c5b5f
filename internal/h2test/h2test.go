// Package h2test is for tests of gRPC servers' HTTP/2 settings: it reads
// what a server announces on a fresh connection.
package h2test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// MaxConcurrentStreams sends HTTP/2's client preface and an empty
// SETTINGS on conn (plain TCP, or TLS with ALPN h2) and returns the
// SETTINGS_MAX_CONCURRENT_STREAMS of the server's first SETTINGS (0: it
// announced none).
func MaxConcurrentStreams(t testing.TB, conn net.Conn) uint32 {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, bufio.NewReader(conn))
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the server's SETTINGS: %v", err)
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			continue
		}
		v, _ := sf.Value(http2.SettingMaxConcurrentStreams)
		return v
	}
}
