package spool

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// payload makes a payload of n bytes (n >= 8) that starts with id.
func payload(id uint64, n int) []byte {
	p := make([]byte, n)
	binary.LittleEndian.PutUint64(p, id)
	for i := 8; i < n; i++ {
		p[i] = byte(id) + byte(i)
	}
	return p
}

func idOf(t *testing.T, p []byte) uint64 {
	t.Helper()
	if len(p) < 8 {
		t.Fatalf("payload of %d bytes has no id", len(p))
	}
	return binary.LittleEndian.Uint64(p)
}

func mustOpen(t testing.TB, o Options) *Spool {
	t.Helper()
	s, err := Open(o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func mustAppend(t testing.TB, s *Spool, p []byte) {
	t.Helper()
	if err := s.Append(p); err != nil {
		t.Fatalf("Append: %v", err)
	}
}

// ids peeks everything waiting and returns the ids, in order.
func peekIDs(t *testing.T, s *Spool) []uint64 {
	t.Helper()
	recs, err := s.Peek(0, 0)
	if err != nil {
		t.Fatalf("Peek: %v", err)
	}
	var ids []uint64
	for _, r := range recs {
		ids = append(ids, idOf(t, r.Payload))
	}
	return ids
}

func seq(from, to uint64) []uint64 {
	var ids []uint64
	for i := from; i < to; i++ {
		ids = append(ids, i)
	}
	return ids
}

func segFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(m)
	return m
}

func diskBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	for _, f := range segFiles(t, dir) {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

// copyDir copies the spool files of src into a new directory, as they are
// now: a crash of the owning process without Close or Sync.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == lockName {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func TestAppendPeekAck(t *testing.T) {
	dir := t.TempDir()
	now := time.Unix(1_700_000_000, 0)
	s := mustOpen(t, Options{Dir: dir, MaxBytes: 1 << 20, Now: func() time.Time { return now }})
	defer s.Close()

	if recs, err := s.Peek(10, 0); err != nil || recs != nil {
		t.Fatalf("Peek on empty = %v, %v; want nil, nil", recs, err)
	}
	for i := range uint64(5) {
		mustAppend(t, s, payload(i, 20))
	}
	st := s.Stats()
	if st.Waiting != 5 || st.Bytes != 5*(HeaderSize+20) || st.Appended != 5 || !st.Oldest.Equal(now) {
		t.Fatalf("Stats = %+v", st)
	}
	recs, err := s.Peek(3, 0)
	if err != nil || len(recs) != 3 {
		t.Fatalf("Peek(3) = %d records, %v", len(recs), err)
	}
	// Peek again: the same records.
	again, _ := s.Peek(3, 0)
	for i := range recs {
		if !bytes.Equal(recs[i].Payload, payload(uint64(i), 20)) || !bytes.Equal(again[i].Payload, recs[i].Payload) {
			t.Fatalf("record %d = %x", i, recs[i].Payload)
		}
		if !recs[i].Appended.Equal(now) {
			t.Fatalf("Appended = %v, want %v", recs[i].Appended, now)
		}
	}
	if err := s.Ack(2); err != nil {
		t.Fatal(err)
	}
	if err := s.Ack(1); err != nil {
		t.Fatal(err)
	}
	if got := peekIDs(t, s); !slices.Equal(got, []uint64{3, 4}) {
		t.Fatalf("after ack: %v", got)
	}
	if err := s.Ack(2); err != nil {
		t.Fatal(err)
	}
	st = s.Stats()
	if st.Waiting != 0 || st.Bytes != 0 || st.Acked != 5 || !st.Oldest.IsZero() {
		t.Fatalf("Stats = %+v", st)
	}
}

func TestPeekLimits(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, Options{Dir: dir, MaxBytes: 1 << 20})
	defer s.Close()
	for i, n := range []int{10, 20, 30, 40} {
		mustAppend(t, s, payload(uint64(i), n))
	}
	for _, tc := range []struct {
		max, maxBytes, want int
	}{
		{0, 0, 4},
		{2, 0, 2},
		{0, 25, 1},
		{0, 30, 2},
		{0, 5, 1}, // the first is returned whatever its size
		{3, 1000, 3},
		{10, 59, 2},
		{10, 60, 3},
	} {
		recs, err := s.Peek(tc.max, tc.maxBytes)
		if err != nil || len(recs) != tc.want {
			t.Errorf("Peek(%d, %d) = %d records, %v; want %d", tc.max, tc.maxBytes, len(recs), err, tc.want)
		}
	}
}

func TestAckErrors(t *testing.T) {
	s := mustOpen(t, Options{Dir: t.TempDir(), MaxBytes: 1 << 20})
	defer s.Close()
	for i := range uint64(5) {
		mustAppend(t, s, payload(i, 10))
	}
	if err := s.Ack(1); err == nil {
		t.Fatal("Ack(1) before any Peek succeeded")
	}
	if err := s.Ack(0); err != nil {
		t.Fatalf("Ack(0): %v", err)
	}
	if recs, _ := s.Peek(3, 0); len(recs) != 3 {
		t.Fatalf("Peek(3) = %d", len(recs))
	}
	if err := s.Ack(4); err == nil {
		t.Fatal("Ack(4) after a Peek of 3 succeeded")
	}
	if err := s.Ack(-1); err == nil {
		t.Fatal("Ack(-1) succeeded")
	}
	if err := s.Ack(2); err != nil {
		t.Fatal(err)
	}
	if err := s.Ack(1); err != nil {
		t.Fatal(err)
	}
	if err := s.Ack(1); err == nil {
		t.Fatal("Ack past the peeked records succeeded")
	}
	if got := peekIDs(t, s); !slices.Equal(got, []uint64{3, 4}) {
		t.Fatalf("waiting = %v", got)
	}
}

func TestTooLarge(t *testing.T) {
	for _, p := range []Policy{DropOldest, DropNewest} {
		s := mustOpen(t, Options{Dir: t.TempDir(), MaxBytes: 100, WhenFull: p})
		err := s.Append(make([]byte, 85))
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "101") || !strings.Contains(err.Error(), "100") {
			t.Errorf("%s: Append(85 bytes) = %v; want ErrTooLarge naming 101 and 100", p, err)
		}
		if err := s.Append(make([]byte, 84)); err != nil {
			t.Errorf("%s: Append(84 bytes) = %v", p, err)
		}
		if st := s.Stats(); st.Waiting != 1 || st.DroppedFull != 0 {
			t.Errorf("%s: Stats = %+v", p, st)
		}
		s.Close()
	}
}

func TestOptionsErrors(t *testing.T) {
	for _, o := range []Options{
		{MaxBytes: 100},
		{Dir: t.TempDir()},
		{Dir: t.TempDir(), MaxBytes: 100, WhenFull: "drop-all"},
		{Dir: t.TempDir(), MaxBytes: 100, MaxAge: -1},
	} {
		if s, err := Open(o); err == nil {
			s.Close()
			t.Errorf("Open(%+v) succeeded", o)
		}
	}
}

func TestClosed(t *testing.T) {
	s := mustOpen(t, Options{Dir: t.TempDir(), MaxBytes: 1000})
	mustAppend(t, s, payload(1, 10))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(payload(2, 10)); !errors.Is(err, ErrClosed) {
		t.Errorf("Append after Close = %v", err)
	}
	if _, err := s.Peek(1, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Peek after Close = %v", err)
	}
	if err := s.Ack(0); !errors.Is(err, ErrClosed) {
		t.Errorf("Ack after Close = %v", err)
	}
	if err := s.Sync(); !errors.Is(err, ErrClosed) {
		t.Errorf("Sync after Close = %v", err)
	}
	if err := s.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("Close after Close = %v", err)
	}
	if err := s.Wait(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Wait after Close = %v", err)
	}
	if st := s.Stats(); st.Waiting != 1 {
		t.Errorf("Stats after Close = %+v", st)
	}
}

func TestLocked(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, Options{Dir: dir, MaxBytes: 1000})
	_, err := Open(Options{Dir: dir, MaxBytes: 1000})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v; want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "pid") {
		t.Errorf("ErrLocked message %q does not name the dir and pid", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, Options{Dir: dir, MaxBytes: 1000})
	s.Close()
}

func TestDropOldest(t *testing.T) {
	dir := t.TempDir()
	// 100-byte records, 10 fit; segments of 2 records.
	s := mustOpen(t, Options{Dir: dir, MaxBytes: 1000, SegmentBytes: 200})
	defer s.Close()
	for i := range uint64(15) {
		mustAppend(t, s, payload(i, 100-HeaderSize))
	}
	st := s.Stats()
	if st.Waiting != 10 || st.Bytes != 1000 || st.DroppedFull != 5 || st.Appended != 15 {
		t.Fatalf("Stats = %+v", st)
	}
	if d := diskBytes(t, dir); d > 1000+200 {
		t.Fatalf("disk = %d bytes, more than MaxBytes + one segment", d)
	}
	recs, err := s.Peek(4, 0) // 5..8
	if err != nil || len(recs) != 4 || idOf(t, recs[0].Payload) != 5 {
		t.Fatalf("Peek = %d records, %v", len(recs), err)
	}
	// Two more: 5 and 6 are dropped while being delivered.
	mustAppend(t, s, payload(15, 100-HeaderSize))
	mustAppend(t, s, payload(16, 100-HeaderSize))
	if err := s.Ack(4); err != nil {
		t.Fatal(err)
	}
	st = s.Stats()
	if st.Acked != 2 || st.DroppedFull != 7 || st.Waiting != 8 {
		t.Fatalf("Stats after ack = %+v", st)
	}
	if got := peekIDs(t, s); !slices.Equal(got, seq(9, 17)) {
		t.Fatalf("waiting = %v", got)
	}
	// All of a peek dropped before its ack.
	recs, _ = s.Peek(2, 0) // 9, 10
	for i := range uint64(4) {
		mustAppend(t, s, payload(17+i, 100-HeaderSize)) // drops 9..12
	}
	if err := s.Ack(len(recs)); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Acked != 2 || st.Waiting != 10 {
		t.Fatalf("Stats = %+v", st)
	}
	if got := peekIDs(t, s); !slices.Equal(got, seq(11, 21)) {
		t.Fatalf("waiting = %v", got)
	}
	if d := diskBytes(t, dir); d > 1000+200 {
		t.Fatalf("disk = %d bytes, more than MaxBytes + one segment", d)
	}
}

func TestDropNewest(t *testing.T) {
	s := mustOpen(t, Options{Dir: t.TempDir(), MaxBytes: 1000, WhenFull: DropNewest})
	defer s.Close()
	for i := range uint64(10) {
		mustAppend(t, s, payload(i, 100-HeaderSize))
	}
	for i := range uint64(3) {
		if err := s.Append(payload(10+i, 100-HeaderSize)); !errors.Is(err, ErrFull) {
			t.Fatalf("Append when full = %v; want ErrFull", err)
		}
	}
	if st := s.Stats(); st.DroppedFull != 3 || st.Waiting != 10 || st.Bytes != 1000 {
		t.Fatalf("Stats = %+v", st)
	}
	if recs, _ := s.Peek(1, 0); idOf(t, recs[0].Payload) != 0 {
		t.Fatal("oldest record lost")
	}
	if err := s.Ack(1); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, s, payload(20, 100-HeaderSize)) // room again
	want := append(seq(1, 10), 20)
	if got := peekIDs(t, s); !slices.Equal(got, want) {
		t.Fatalf("waiting = %v", got)
	}
}

// TestDropNewestKeepsAPrefix: once a record is refused for room, a smaller
// one that would fit is refused too, until a record leaves: what is kept
// is a prefix of what came (no holes: the dropped are the newest).
func TestDropNewestKeepsAPrefix(t *testing.T) {
	s := mustOpen(t, Options{Dir: t.TempDir(), MaxBytes: 1000, WhenFull: DropNewest})
	defer s.Close()
	for i := range uint64(9) {
		mustAppend(t, s, payload(i, 100-HeaderSize))
	}
	mustAppend(t, s, payload(9, 60-HeaderSize)) // 960 bytes held
	if err := s.Append(payload(10, 50-HeaderSize)); !errors.Is(err, ErrFull) {
		t.Fatalf("a 50-byte record into 40 free = %v; want ErrFull", err)
	}
	if err := s.Append(payload(11, 30-HeaderSize)); !errors.Is(err, ErrFull) {
		t.Fatalf("a 30-byte record after a refusal = %v; want ErrFull (it would fit, but 10 was dropped)", err)
	}
	if st := s.Stats(); st.DroppedFull != 2 || st.Waiting != 10 {
		t.Fatalf("Stats = %+v", st)
	}
	if _, err := s.Peek(1, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Ack(1); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, s, payload(12, 30-HeaderSize)) // a record left: appends resume
}

func TestMaxAge(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	o := Options{Dir: t.TempDir(), MaxBytes: 1 << 20, MaxAge: time.Minute, Now: func() time.Time { return now }}
	s := mustOpen(t, o)
	mustAppend(t, s, payload(0, 10))
	now = t0.Add(30 * time.Second)
	mustAppend(t, s, payload(1, 10))
	now = t0.Add(90 * time.Second)
	mustAppend(t, s, payload(2, 10))
	if st := s.Stats(); st.Waiting != 3 || !st.Oldest.Equal(t0) {
		t.Fatalf("Stats = %+v", st)
	}
	// 0 is 90 s old: expired; 1 is exactly MaxAge old: not older.
	if got := peekIDs(t, s); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("waiting = %v", got)
	}
	if st := s.Stats(); st.Expired != 1 || st.Waiting != 2 || !st.Oldest.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("Stats = %+v", st)
	}
	// Expiry across a reopen, and all of them.
	s.Close()
	now = t0.Add(time.Hour)
	s = mustOpen(t, o)
	defer s.Close()
	if st := s.Stats(); st.Waiting != 2 {
		t.Fatalf("Stats after reopen = %+v", st)
	}
	if recs, err := s.Peek(10, 0); recs != nil || err != nil {
		t.Fatalf("Peek = %v, %v; want nil", recs, err)
	}
	if st := s.Stats(); st.Expired != 2 || st.Waiting != 0 || st.Bytes != 0 {
		t.Fatalf("Stats = %+v", st)
	}
}

func TestSegmentsRollAndDelete(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, Options{Dir: dir, MaxBytes: 1 << 20, SegmentBytes: 500})
	defer s.Close()
	for i := range uint64(23) {
		mustAppend(t, s, payload(i, 100-HeaderSize))
	}
	files := segFiles(t, dir)
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	want := []string{
		"00000000000000000001.seg", "00000000000000000002.seg", "00000000000000000003.seg",
		"00000000000000000004.seg", "00000000000000000005.seg",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("segments = %v; want %v", names, want)
	}
	if fi, _ := os.Stat(files[0]); fi.Size() != 500 {
		t.Fatalf("first segment is %d bytes", fi.Size())
	}
	recs, _ := s.Peek(7, 0)
	if err := s.Ack(len(recs)); err != nil {
		t.Fatal(err)
	}
	if n := len(segFiles(t, dir)); n != 4 {
		t.Fatalf("%d segments after acking the first; want 4", n)
	}
	if st := s.Stats(); st.Bytes != 16*100 || st.Segments != 4 {
		t.Fatalf("Stats = %+v", st)
	}
	recs, _ = s.Peek(0, 0)
	if err := s.Ack(len(recs)); err != nil {
		t.Fatal(err)
	}
	if got := segFiles(t, dir); len(got) != 1 || filepath.Base(got[0]) != "00000000000000000005.seg" {
		t.Fatalf("segments after acking all = %v", got)
	}
	if st := s.Stats(); st.Bytes != 0 || st.Waiting != 0 {
		t.Fatalf("Stats = %+v", st)
	}
	// A reopen of an empty spool keeps going in the last segment, and the
	// next rollover deletes it.
	s.Close()
	s = mustOpen(t, Options{Dir: dir, MaxBytes: 1 << 20, SegmentBytes: 500})
	for i := range uint64(3) {
		mustAppend(t, s, payload(100+i, 100-HeaderSize))
	}
	if got := segFiles(t, dir); len(got) != 2 || filepath.Base(got[1]) != "00000000000000000006.seg" {
		t.Fatalf("segments after reopen and append = %v", got)
	}
	if got := peekIDs(t, s); !slices.Equal(got, seq(100, 103)) {
		t.Fatalf("waiting = %v", got)
	}
	if err := s.Ack(3); err != nil {
		t.Fatal(err)
	}
	if got := segFiles(t, dir); len(got) != 1 || filepath.Base(got[0]) != "00000000000000000006.seg" {
		t.Fatalf("segments after acking all = %v", got)
	}
}

func TestWait(t *testing.T) {
	s := mustOpen(t, Options{Dir: t.TempDir(), MaxBytes: 1000})
	ctx := context.Background()

	// Woken by Append.
	errc := make(chan error, 1)
	go func() { errc <- s.Wait(ctx) }()
	mustAppend(t, s, payload(0, 10))
	if err := <-errc; err != nil {
		t.Fatalf("Wait = %v", err)
	}
	// Immediate while a record waits.
	if err := s.Wait(ctx); err != nil {
		t.Fatalf("Wait = %v", err)
	}
	recs, _ := s.Peek(1, 0)
	if err := s.Ack(len(recs)); err != nil {
		t.Fatal(err)
	}

	// Context cancelled.
	cctx, cancel := context.WithCancel(ctx)
	go func() { errc <- s.Wait(cctx) }()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v; want context.Canceled", err)
	}

	// Closed.
	go func() { errc <- s.Wait(ctx) }()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait = %v; want ErrClosed", err)
	}
}

// TestConcurrent runs an appender and a deliverer at once (for -race).
func TestConcurrent(t *testing.T) {
	s := mustOpen(t, Options{Dir: t.TempDir(), MaxBytes: 1 << 20, SegmentBytes: 4096})
	defer s.Close()
	const n = 2000
	done := make(chan error, 1)
	go func() {
		for i := range uint64(n) {
			if err := s.Append(payload(i, 50)); err != nil {
				done <- err
				return
			}
			if i%100 == 0 {
				if err := s.Sync(); err != nil {
					done <- err
					return
				}
			}
		}
		done <- nil
	}()
	next := uint64(0)
	for next < n {
		if err := s.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		recs, err := s.Peek(37, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if id := idOf(t, r.Payload); id != next {
				t.Fatalf("got %d, want %d", id, next)
			}
			next++
		}
		if err := s.Ack(len(recs)); err != nil {
			t.Fatal(err)
		}
		_ = s.Stats()
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Acked != n || st.Waiting != 0 {
		t.Fatalf("Stats = %+v", st)
	}
}

func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	o := Options{Dir: dir, MaxBytes: 1 << 20}
	s := mustOpen(t, o)
	for i := range uint64(10) {
		mustAppend(t, s, payload(i, 40))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files := segFiles(t, dir)
	last := files[len(files)-1]
	fi, _ := os.Stat(last)
	for _, cut := range []int64{5, 40 + HeaderSize - 3} { // mid payload, mid header
		if err := os.Truncate(last, fi.Size()-cut); err != nil {
			t.Fatal(err)
		}
		s = mustOpen(t, o)
		if st := s.Stats(); st.Corrupt != 1 || st.Waiting != 9 || st.Bytes != 9*(40+HeaderSize) {
			t.Fatalf("cut %d: Stats = %+v", cut, st)
		}
		if got := peekIDs(t, s); !slices.Equal(got, seq(0, 9)) {
			t.Fatalf("waiting = %v", got)
		}
		mustAppend(t, s, payload(9, 40)) // after the truncated tail
		s.Close()
		s = mustOpen(t, o)
		if st := s.Stats(); st.Corrupt != 0 || st.Waiting != 10 {
			t.Fatalf("reopen: Stats = %+v", st)
		}
		if got := peekIDs(t, s); !slices.Equal(got, seq(0, 10)) {
			t.Fatalf("waiting = %v", got)
		}
		s.Close()
		fi, _ = os.Stat(last)
	}
}

func TestDamagedMiddle(t *testing.T) {
	dir := t.TempDir()
	o := Options{Dir: dir, MaxBytes: 1 << 20, SegmentBytes: 500}
	s := mustOpen(t, o)
	for i := range uint64(12) { // segments of 5, 5, 2
		mustAppend(t, s, payload(i, 100-HeaderSize))
	}
	s.Close()
	first := segFiles(t, dir)[0]
	b, _ := os.ReadFile(first)
	b[100+HeaderSize+20] ^= 0xff // payload of record 1
	if err := os.WriteFile(first, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, o)
	defer s.Close()
	if st := s.Stats(); st.Corrupt != 1 || st.Waiting != 8 {
		t.Fatalf("Stats = %+v", st)
	}
	want := append([]uint64{0}, seq(5, 12)...)
	if got := peekIDs(t, s); !slices.Equal(got, want) {
		t.Fatalf("waiting = %v; want %v", got, want)
	}
}

func TestHugeLengthOnDisk(t *testing.T) {
	dir := t.TempDir()
	var rec [HeaderSize]byte
	binary.LittleEndian.PutUint32(rec[0:], 0xffffffff)
	good := encodeRecord(payload(7, 30), 1)
	data := append(good, rec[:]...)
	if err := os.WriteFile(filepath.Join(dir, segName(1)), data, 0o600); err != nil {
		t.Fatal(err)
	}
	s := mustOpen(t, Options{Dir: dir, MaxBytes: 1 << 20})
	defer s.Close()
	if st := s.Stats(); st.Corrupt != 1 || st.Waiting != 1 {
		t.Fatalf("Stats = %+v", st)
	}
	if fi, _ := os.Stat(filepath.Join(dir, segName(1))); fi.Size() != int64(len(good)) {
		t.Fatalf("segment not truncated: %d bytes", fi.Size())
	}
}

func TestMaxBytesLowered(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, Options{Dir: dir, MaxBytes: 1 << 20})
	for i := range uint64(10) {
		mustAppend(t, s, payload(i, 100-HeaderSize))
	}
	s.Close()
	s = mustOpen(t, Options{Dir: dir, MaxBytes: 500})
	defer s.Close()
	if st := s.Stats(); st.Waiting != 5 || st.DroppedFull != 5 || st.Bytes != 500 {
		t.Fatalf("Stats = %+v", st)
	}
	if got := peekIDs(t, s); !slices.Equal(got, seq(5, 10)) {
		t.Fatalf("waiting = %v", got)
	}
}

// TestMaxBytesLoweredBigRecord: a record over a MaxBytes lowered since it
// was written is dropped (counted as full), not taken for damage: the
// records after it stay.
func TestMaxBytesLoweredBigRecord(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, Options{Dir: dir, MaxBytes: 1 << 20})
	for i := range uint64(11) {
		n := 50
		if i == 5 {
			n = 100 << 10
		}
		mustAppend(t, s, payload(i, n))
	}
	s.Close()
	s = mustOpen(t, Options{Dir: dir, MaxBytes: 64 << 10})
	defer s.Close()
	if st := s.Stats(); st.Waiting != 10 || st.DroppedFull != 1 || st.Corrupt != 0 {
		t.Fatalf("Stats = %+v: want the 10 small records waiting, the big one dropped as full", st)
	}
	if got := peekIDs(t, s); !slices.Equal(got, []uint64{0, 1, 2, 3, 4, 6, 7, 8, 9, 10}) {
		t.Fatalf("waiting = %v", got)
	}
}

// TestProperty appends random payloads, peeks and acks in random chunks,
// syncs, reopens and crashes at random points, against a model.
func TestProperty(t *testing.T) {
	for seed := range uint64(5) {
		t.Run("", func(t *testing.T) { property(t, seed) })
	}
}

func property(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	dir := t.TempDir()
	o := Options{Dir: dir, MaxBytes: 1 << 20, SegmentBytes: int64(512 + r.IntN(2048))}
	s := mustOpen(t, o)
	defer func() { s.Close() }()

	var all [][]byte // every payload appended, id = index
	acked := 0       // all[:acked] left the spool
	synced := 0      // the value of acked when the cursor was last written
	maxSegs, restarts := 0, 0
	check := func(what string) {
		t.Helper()
		st := s.Stats()
		maxSegs = max(maxSegs, st.Segments)
		var bytes int64
		for _, p := range all[acked:] {
			bytes += HeaderSize + int64(len(p))
		}
		if st.Waiting != len(all)-acked || st.Bytes != bytes {
			t.Fatalf("seed %d, %s: Stats = %+v; want %d waiting, %d bytes", seed, what, st, len(all)-acked, bytes)
		}
	}
	for op := 0; op < 300; op++ {
		reopened := false
		switch k := r.IntN(24); {
		case k < 11:
			id := uint64(len(all))
			p := payload(id, 8+r.IntN(300))
			mustAppend(t, s, p)
			all = append(all, p)
		case k < 20:
			recs, err := s.Peek(1+r.IntN(12), r.IntN(1500))
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) > len(all)-acked || (len(recs) == 0) != (acked == len(all)) {
				t.Fatalf("seed %d: Peek returned %d with %d waiting", seed, len(recs), len(all)-acked)
			}
			for i, rec := range recs {
				if !bytes.Equal(rec.Payload, all[acked+i]) {
					t.Fatalf("seed %d: record %d = id %d, want %d", seed, i, idOf(t, rec.Payload), acked+i)
				}
			}
			// Ack in one or two chunks.
			n := r.IntN(len(recs) + 1)
			m := n / 2
			if err := s.Ack(m); err != nil {
				t.Fatal(err)
			}
			if err := s.Ack(n - m); err != nil {
				t.Fatal(err)
			}
			acked += n
		case k < 22:
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
			synced = acked
		case k < 23:
			// Clean restart: exactly once.
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = mustOpen(t, o)
			synced = acked
			reopened = true
			if st := s.Stats(); st.Corrupt != 0 {
				t.Fatalf("seed %d: Corrupt after clean reopen: %+v", seed, st)
			}
		default:
			// Crash: the files as they are, no Close, no Sync.
			crashed := copyDir(t, o.Dir)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			o.Dir = crashed
			s = mustOpen(t, o)
			st := s.Stats()
			first := len(all) - st.Waiting
			// Nothing unacked is lost; what was acked since the last
			// sync may come back.
			if first < synced || first > acked {
				t.Fatalf("seed %d: after crash %d wait: first %d not in [%d, %d]", seed, st.Waiting, first, synced, acked)
			}
			if st.Corrupt != 0 {
				t.Fatalf("seed %d: Corrupt after crash: %+v", seed, st)
			}
			acked, synced = first, first
			reopened = true
		}
		check("op")
		if reopened {
			restarts++
		}
		if op%16 != 0 && !reopened {
			continue
		}
		if got := peekIDs(t, s); !slices.Equal(got, seq(uint64(acked), uint64(len(all)))) {
			t.Fatalf("seed %d: waiting %v; want %d..%d", seed, got, acked, len(all))
		}
	}
	if maxSegs < 3 || restarts < 3 {
		t.Fatalf("seed %d: weak run: at most %d segments, %d restarts", seed, maxSegs, restarts)
	}
	// Drain: only the write segment is left.
	recs, _ := s.Peek(0, 0)
	if err := s.Ack(len(recs)); err != nil {
		t.Fatal(err)
	}
	acked = len(all)
	check("drained")
	if n := len(segFiles(t, o.Dir)); n != 1 {
		t.Fatalf("seed %d: %d segment files after draining", seed, n)
	}
}

func encodeRecord(p []byte, t int64) []byte {
	rec := make([]byte, HeaderSize+len(p))
	binary.LittleEndian.PutUint32(rec[0:], uint32(len(p)))
	binary.LittleEndian.PutUint32(rec[4:], crc32.Checksum(p, castagnoli))
	binary.LittleEndian.PutUint64(rec[8:], uint64(t))
	copy(rec[HeaderSize:], p)
	return rec
}

func FuzzOpen(f *testing.F) {
	// Small seeds: the fuzzer minimizes each new input it finds, and every
	// run goes to the file system.
	var valid []byte
	for i := range 3 {
		valid = append(valid, encodeRecord([]byte("abcdefgh")[:i*3+1], int64(i))...)
	}
	f.Add(valid, encodeCursor(cursor{seq: 1, off: 0}))
	f.Add(valid, encodeCursor(cursor{seq: 1, off: HeaderSize + 1}))
	f.Add(valid[:len(valid)-3], encodeCursor(cursor{seq: 1, off: 7}))
	f.Add(valid, encodeCursor(cursor{seq: 3, off: 0}))
	f.Add(valid, []byte("garbage"))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, []byte{})
	f.Add([]byte{}, encodeCursor(cursor{seq: maxSeq/2 - 1, off: 1 << 40}))
	root := fuzzRoot(f)
	const maxBytes = 256
	f.Fuzz(func(t *testing.T, seg, cur []byte) {
		// One directory, emptied for each run (cheaper than t.TempDir).
		dir := filepath.Join(root, "spool")
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, segName(1)), seg, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, cursorName), cur, 0o600); err != nil {
			t.Fatal(err)
		}
		o := Options{Dir: dir, MaxBytes: maxBytes, SegmentBytes: 128, noSync: true}
		s, err := Open(o)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		st := s.Stats()
		if st.Bytes > maxBytes || st.Bytes > int64(len(seg)) || st.Corrupt > 1 {
			t.Fatalf("Stats = %+v for %d bytes", st, len(seg))
		}
		recs, err := s.Peek(0, 0)
		if err != nil {
			t.Fatalf("Peek: %v", err)
		}
		if len(recs) != st.Waiting {
			t.Fatalf("Peek returned %d, %d waiting", len(recs), st.Waiting)
		}
		for _, r := range recs {
			if HeaderSize+len(r.Payload) > maxBytes {
				t.Fatalf("record of %d bytes > MaxBytes", len(r.Payload))
			}
		}
		if err := s.Ack(len(recs) / 2); err != nil {
			t.Fatal(err)
		}
		mustAppend(t, s, []byte("after"))
		want := s.Stats().Waiting
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = mustOpen(t, o)
		defer s.Close()
		st2 := s.Stats()
		if st2.Corrupt != 0 || st2.Waiting != want {
			t.Fatalf("reopen: Stats = %+v, want %d waiting", st2, want)
		}
		recs2, _ := s.Peek(0, 0)
		if got := recs2[len(recs2)-1].Payload; string(got) != "after" {
			t.Fatalf("last record = %q", got)
		}
	})
}

// fuzzRoot is a directory for FuzzOpen: on tmpfs (/dev/shm) where there is
// one, as every run creates, renames and deletes files; else f.TempDir.
func fuzzRoot(f *testing.F) string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		if dir, err := os.MkdirTemp("/dev/shm", "spool-fuzz-"); err == nil {
			f.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return f.TempDir()
}

func BenchmarkAppendAck(b *testing.B) {
	s := mustOpen(b, Options{Dir: b.TempDir(), MaxBytes: 64 << 20})
	defer s.Close()
	p := make([]byte, 1024)
	b.SetBytes(int64(len(p)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		mustAppend(b, s, p)
		if i%64 == 63 {
			recs, err := s.Peek(64, 0)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Ack(len(recs)); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

func TestCrashRedelivers(t *testing.T) {
	dir := t.TempDir()
	o := Options{Dir: dir, MaxBytes: 1 << 20}
	s := mustOpen(t, o)
	defer s.Close()
	for i := range uint64(5) {
		mustAppend(t, s, payload(i, 30))
	}
	recs, _ := s.Peek(1, 0)
	if err := s.Ack(len(recs)); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	recs, _ = s.Peek(2, 0)
	if err := s.Ack(len(recs)); err != nil { // 1, 2: acked, not synced
		t.Fatal(err)
	}
	mustAppend(t, s, payload(5, 30)) // written, not synced

	crashed := copyDir(t, dir)
	c := mustOpen(t, Options{Dir: crashed, MaxBytes: 1 << 20})
	defer c.Close()
	if got := peekIDs(t, c); !slices.Equal(got, seq(1, 6)) {
		t.Fatalf("after crash: waiting %v; want 1..5 (1 and 2 again)", got)
	}
	// The original, synced: exactly once.
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	synced := copyDir(t, dir)
	c2 := mustOpen(t, Options{Dir: synced, MaxBytes: 1 << 20})
	defer c2.Close()
	if got := peekIDs(t, c2); !slices.Equal(got, seq(3, 6)) {
		t.Fatalf("after sync and crash: waiting %v; want 3..5", got)
	}
}
