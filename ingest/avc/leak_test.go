package avc

import (
	"bufio"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
)

// rssKiB is the process's resident set (Linux).
func rssKiB(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Skip("no VmRSS")
	return 0
}

// TestNoLeak: thousands of decodes (pictures, skips, errors) and encodes
// leave the resident set where it was; one leaked picture or packet per
// call would grow it by hundreds of megabytes (a 320x240 picture is 115 KB
// in libavcodec, 230 KB as BGR).
func TestNoLeak(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of decodes")
	}
	src := patternClip(t, 320, 240, 30)
	aus := encodeClip(t, h264Setup, EncoderConfig{Width: 320, Height: 240, KeyEvery: 30}, src)
	bad := append([]byte(nil), aus[5].Data[:len(aus[5].Data)/2]...)
	round := func(n int) {
		dec, err := NewDecoder(H264)
		if err != nil {
			t.Fatal(err)
		}
		defer dec.Close()
		enc, err := NewEncoder(EncoderConfig{Width: 320, Height: 240})
		if err != nil {
			t.Fatal(err)
		}
		defer enc.Close()
		for i := range n {
			au := aus[i%len(aus)].Data
			switch i % 4 {
			case 0, 1:
				if _, err := dec.Decode(au); err != nil {
					t.Fatal(err)
				}
			case 2:
				if err := dec.Skip(au); err != nil {
					t.Fatal(err)
				}
			case 3:
				_, _ = dec.Decode(bad) // an error
				_, _ = dec.Decode(au)  // damaged until the next key frame, or a picture
			}
			if i%10 == 0 {
				if _, err := enc.Encode(src[i%len(src)], int64(i), false); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	round(500) // warm up: allocator pools, the Go heap's size
	debug.FreeOSMemory()
	before := rssKiB(t)
	round(3000)
	debug.FreeOSMemory()
	after := rssKiB(t)
	t.Logf("resident set %d KiB -> %d KiB", before, after)
	if after-before > 12<<10 {
		t.Errorf("resident set grew by %d KiB over 3000 decodes", after-before)
	}
}
