package spool

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Policy says what Append does when the spool is full.
type Policy string

const (
	// DropOldest drops the oldest waiting records to make room (default).
	DropOldest Policy = "drop-oldest"
	// DropNewest refuses the record being appended (Append returns ErrFull).
	DropNewest Policy = "drop-newest"
)

// Options configures Open.
type Options struct {
	Dir          string           // created (0700) if missing; holds segment files, the cursor file and a lock file
	MaxBytes     int64            // bound on the bytes of records waiting (payload + per-record header); required > 0
	MaxAge       time.Duration    // records older than this when read are dropped as expired (0: no limit)
	WhenFull     Policy           // "" means DropOldest
	SegmentBytes int64            // a segment file rolls over past this size (0: max(64 KiB, MaxBytes/16), at most MaxBytes)
	Now          func() time.Time // injected clock (nil: time.Now); used for record times and MaxAge

	noSync bool // tests only: skip fsync (fuzzing on slow disks)
}

var (
	// ErrFull is returned by Append under DropNewest when the record does not fit.
	ErrFull = errors.New("spool: full")
	// ErrClosed is returned by methods called after Close (and by Wait on Close).
	ErrClosed = errors.New("spool: closed")
	// ErrLocked is returned (wrapped, naming the directory and the holder's
	// pid when known) by Open when another Spool holds the directory.
	ErrLocked = errors.New("spool: directory locked")
	// ErrTooLarge is returned (wrapped, naming both sizes) by Append for a
	// record that is larger than MaxBytes on its own, whatever the policy.
	ErrTooLarge = errors.New("spool: record larger than MaxBytes")
)

// Record is a waiting record returned by Peek.
type Record struct {
	Payload  []byte
	Appended time.Time
}

// Stats describes a spool.
type Stats struct {
	Waiting     int       // records appended, not yet acked (expired ones not yet skipped included)
	Bytes       int64     // their bytes on disk
	Oldest      time.Time // Appended of the oldest waiting record (zero when none)
	Appended    uint64    // since Open
	Acked       uint64
	DroppedFull uint64 // dropped or refused by the full policy
	Expired     uint64 // skipped by MaxAge
	Corrupt     uint64 // records found damaged on Open (a torn tail after a crash, a bad checksum) and skipped
	Segments    int    // segment files on disk
}

// HeaderSize is the size of the per-record header on disk.
const HeaderSize = 16

const (
	segSuffix   = ".seg"
	cursorName  = "cursor"
	cursorTmp   = "cursor.tmp"
	lockName    = "lock"
	cursorMagic = "MDSPCUR1"
	cursorSize  = 36
	maxSeq      = uint64(1) << 62
	scanChunk   = 32 << 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// meta is what the spool remembers of a waiting record.
type meta struct {
	seg uint64
	off int64
	n   uint32 // payload length
	t   int64  // appended, unix nanoseconds
}

func (m meta) size() int64 { return HeaderSize + int64(m.n) }

type segment struct {
	seq  uint64
	size int64 // bytes written (valid ones, for the write segment)
}

// Spool is an on-disk ordered queue. See the package documentation.
type Spool struct {
	o        Options
	dir      string
	maxBytes int64
	segBytes int64
	policy   Policy
	now      func() time.Time

	mu     sync.Mutex
	closed bool
	lock   *os.File

	segs []segment // on disk, in order; the last one is the write segment
	w    *os.File  // write segment
	rseq uint64    // sequence of r
	r    *os.File  // read handle of an older segment (nil when none)

	q       []meta // waiting records are q[qh:]
	qh      int
	firstID uint64 // id of q[qh]; ids are consecutive in append order
	bytes   int64
	// refusing: DropNewest refused a record for room; every later one is
	// refused too until a record leaves (removeFront), so what is kept is
	// a prefix of what came, with no holes (a smaller record must not slip
	// in after a larger one was dropped)
	refusing bool

	peekFirst uint64 // id of the first record of the last Peek not yet acked
	peekN     int    // how many of them remain

	totalAcked uint64 // lifetime, kept in the cursor

	st Stats

	notify   chan struct{} // closed and replaced on Append
	closedCh chan struct{}
}

// Open opens (or creates) the spool in o.Dir.
func Open(o Options) (*Spool, error) {
	if o.Dir == "" {
		return nil, errors.New("spool: Options.Dir is required")
	}
	if o.MaxBytes <= 0 {
		return nil, fmt.Errorf("spool: Options.MaxBytes must be > 0 (got %d)", o.MaxBytes)
	}
	if o.MaxAge < 0 {
		return nil, fmt.Errorf("spool: Options.MaxAge must be >= 0 (got %v)", o.MaxAge)
	}
	policy := o.WhenFull
	switch policy {
	case "":
		policy = DropOldest
	case DropOldest, DropNewest:
	default:
		return nil, fmt.Errorf("spool: unknown Options.WhenFull %q (want %q or %q)", o.WhenFull, DropOldest, DropNewest)
	}
	segBytes := o.SegmentBytes
	if segBytes < 0 {
		return nil, fmt.Errorf("spool: Options.SegmentBytes must be >= 0 (got %d)", o.SegmentBytes)
	}
	if segBytes == 0 {
		segBytes = max(64<<10, o.MaxBytes/16)
	}
	segBytes = min(segBytes, o.MaxBytes)
	now := o.Now
	if now == nil {
		now = time.Now
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	s := &Spool{
		o:        o,
		dir:      o.Dir,
		maxBytes: o.MaxBytes,
		segBytes: segBytes,
		policy:   policy,
		now:      now,
		notify:   make(chan struct{}),
		closedCh: make(chan struct{}),
	}
	lf, err := lockDir(o.Dir)
	if err != nil {
		return nil, err
	}
	s.lock = lf
	if err := s.load(); err != nil {
		s.closeFiles()
		unlock(lf)
		return nil, err
	}
	return s, nil
}

func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		var holder string
		if b, rerr := io.ReadAll(io.LimitReader(f, 32)); rerr == nil {
			if pid := strings.TrimSpace(string(b)); pid != "" {
				holder = " by pid " + strconv.Quote(pid)
			}
		}
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is held%s", ErrLocked, dir, holder)
		}
		return nil, fmt.Errorf("spool: lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

func unlock(f *os.File) {
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	f.Close()
}

func segName(seq uint64) string { return fmt.Sprintf("%020d%s", seq, segSuffix) }

func (s *Spool) segPath(seq uint64) string { return filepath.Join(s.dir, segName(seq)) }

// parseSegName returns the sequence number of a segment file name.
func parseSegName(name string) (uint64, bool) {
	digits, ok := strings.CutSuffix(name, segSuffix)
	if !ok || len(digits) != 20 {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	seq, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || seq == 0 || seq >= maxSeq {
		return 0, false
	}
	return seq, true
}

type cursor struct {
	seq   uint64
	off   int64
	acked uint64
}

func encodeCursor(c cursor) []byte {
	b := make([]byte, cursorSize)
	copy(b, cursorMagic)
	binary.LittleEndian.PutUint64(b[8:], c.seq)
	binary.LittleEndian.PutUint64(b[16:], uint64(c.off))
	binary.LittleEndian.PutUint64(b[24:], c.acked)
	binary.LittleEndian.PutUint32(b[32:], crc32.Checksum(b[:32], castagnoli))
	return b
}

func decodeCursor(b []byte) (cursor, bool) {
	if len(b) != cursorSize || string(b[:8]) != cursorMagic ||
		binary.LittleEndian.Uint32(b[32:]) != crc32.Checksum(b[:32], castagnoli) {
		return cursor{}, false
	}
	c := cursor{
		seq:   binary.LittleEndian.Uint64(b[8:]),
		off:   int64(binary.LittleEndian.Uint64(b[16:])),
		acked: binary.LittleEndian.Uint64(b[24:]),
	}
	// Segment numbers stay below maxSeq; a cursor leaves room to count on.
	if c.seq >= maxSeq/2 || c.off < 0 {
		return cursor{}, false
	}
	return c, true
}

func (s *Spool) readCursor() cursor {
	f, err := os.Open(filepath.Join(s.dir, cursorName))
	if err != nil {
		return cursor{}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, cursorSize+1))
	if err != nil {
		return cursor{}
	}
	c, _ := decodeCursor(b)
	return c
}

// load rebuilds the state from the directory (Open).
func (s *Spool) load() error {
	_ = os.Remove(filepath.Join(s.dir, cursorTmp))
	cur := s.readCursor()
	s.totalAcked = cur.acked

	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	var seqs []uint64
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if seq, ok := parseSegName(e.Name()); ok {
			seqs = append(seqs, seq)
		}
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })

	// Segments wholly before the cursor are acked.
	for len(seqs) > 0 && seqs[0] < cur.seq {
		if err := os.Remove(s.segPath(seqs[0])); err != nil {
			return fmt.Errorf("spool: %w", err)
		}
		seqs = seqs[1:]
	}

	buf := make([]byte, scanChunk)
	for i, seq := range seqs {
		last := i == len(seqs)-1
		skipBefore := int64(-1)
		if seq == cur.seq {
			skipBefore = cur.off
		}
		size, err := s.scan(seq, last, skipBefore, buf)
		if err != nil {
			return err
		}
		s.segs = append(s.segs, segment{seq: seq, size: size})
	}

	// The write segment: the last one, or a new one.
	if len(s.segs) == 0 {
		next := max(cur.seq+1, 1)
		if err := s.createSegment(next); err != nil {
			return err
		}
	} else {
		last := s.segs[len(s.segs)-1]
		f, err := os.OpenFile(s.segPath(last.seq), os.O_RDWR|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("spool: %w", err)
		}
		s.w = f
	}

	// A smaller MaxBytes than last time.
	if s.bytes > s.maxBytes && s.policy == DropOldest {
		for s.waiting() > 0 && s.bytes > s.maxBytes {
			s.removeFront(1)
			s.st.DroppedFull++
		}
	}
	if err := s.deleteDeadSegments(); err != nil {
		return err
	}
	return s.syncLocked()
}

// scan reads one segment, appending its waiting records to the queue, and
// returns the size of its valid part. A damaged record in the last segment
// is truncated away.
func (s *Spool) scan(seq uint64, last bool, skipBefore int64, buf []byte) (int64, error) {
	path := s.segPath(seq)
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("spool: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("spool: %w", err)
	}
	size := fi.Size()
	br := bufio.NewReaderSize(f, scanChunk)
	var hdr [HeaderSize]byte
	off := int64(0)
	damaged := false
	for off < size {
		if size-off < HeaderSize {
			damaged = true
			break
		}
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return 0, fmt.Errorf("spool: read %s: %w", path, err)
		}
		n := int64(binary.LittleEndian.Uint32(hdr[0:]))
		sum := binary.LittleEndian.Uint32(hdr[4:])
		t := int64(binary.LittleEndian.Uint64(hdr[8:]))
		if off+HeaderSize+n > size {
			damaged = true
			break
		}
		var crc uint32
		for rem := n; rem > 0; {
			c := min(rem, int64(len(buf)))
			if _, err := io.ReadFull(br, buf[:c]); err != nil {
				return 0, fmt.Errorf("spool: read %s: %w", path, err)
			}
			crc = crc32.Update(crc, castagnoli, buf[:c])
			rem -= c
		}
		if crc != sum {
			damaged = true
			break
		}
		switch {
		case off < skipBefore:
		case HeaderSize+n > s.maxBytes:
			// intact, but over a MaxBytes lowered since it was written:
			// it can never be sent under this limit (counted as dropped
			// by the full policy, not as damage)
			s.st.DroppedFull++
		default:
			m := meta{seg: seq, off: off, n: uint32(n), t: t}
			s.q = append(s.q, m)
			s.bytes += m.size()
		}
		off += HeaderSize + n
	}
	if damaged {
		s.st.Corrupt++
		if last {
			if err := os.Truncate(path, off); err != nil {
				return 0, fmt.Errorf("spool: truncate damaged tail of %s: %w", path, err)
			}
		}
	}
	return off, nil
}

func (s *Spool) createSegment(seq uint64) error {
	f, err := os.OpenFile(s.segPath(seq), os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	s.w = f
	s.segs = append(s.segs, segment{seq: seq})
	return nil
}

func (s *Spool) waiting() int { return len(s.q) - s.qh }

// removeFront removes n waiting records from the front of the queue.
func (s *Spool) removeFront(n int) {
	if n > 0 {
		s.refusing = false // room again (DropNewest)
	}
	for i := s.qh; i < s.qh+n; i++ {
		s.bytes -= s.q[i].size()
	}
	s.qh += n
	s.firstID += uint64(n)
	if s.qh == len(s.q) {
		s.q = s.q[:0]
		s.qh = 0
	} else if s.qh >= 1024 && s.qh >= len(s.q)/2 {
		s.q = s.q[:copy(s.q, s.q[s.qh:])]
		s.qh = 0
	}
}

// deleteDeadSegments deletes the segments, other than the write segment,
// that hold no waiting record.
func (s *Spool) deleteDeadSegments() error {
	for len(s.segs) > 1 {
		seq := s.segs[0].seq
		if s.waiting() > 0 && s.q[s.qh].seg <= seq {
			return nil
		}
		if s.r != nil && s.rseq == seq {
			s.r.Close()
			s.r = nil
		}
		if err := os.Remove(s.segPath(seq)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("spool: %w", err)
		}
		s.segs = s.segs[1:]
	}
	return nil
}

// Append adds a record. Under DropOldest it drops the oldest waiting records
// when the new one does not fit; under DropNewest it returns ErrFull.
func (s *Spool) Append(payload []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	need := HeaderSize + int64(len(payload))
	if need > s.maxBytes || len(payload) > math.MaxUint32 {
		return fmt.Errorf("%w: record of %d bytes (%d payload + %d header) > MaxBytes %d",
			ErrTooLarge, need, len(payload), HeaderSize, s.maxBytes)
	}
	if s.policy == DropNewest && s.refusing {
		s.st.DroppedFull++
		return ErrFull
	}
	if s.bytes+need > s.maxBytes {
		if s.policy == DropNewest {
			s.refusing = true
			s.st.DroppedFull++
			return ErrFull
		}
		k := 0
		for freed := int64(0); s.bytes-freed+need > s.maxBytes; k++ {
			freed += s.q[s.qh+k].size()
		}
		s.removeFront(k)
		s.st.DroppedFull += uint64(k)
	}
	ws := &s.segs[len(s.segs)-1]
	if ws.size > 0 && ws.size+need > s.segBytes {
		if err := s.roll(); err != nil {
			return err
		}
		ws = &s.segs[len(s.segs)-1]
	}
	t := s.now().UnixNano()
	rec := make([]byte, need)
	binary.LittleEndian.PutUint32(rec[0:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(rec[4:], crc32.Checksum(payload, castagnoli))
	binary.LittleEndian.PutUint64(rec[8:], uint64(t))
	copy(rec[HeaderSize:], payload)
	if _, err := s.w.Write(rec); err != nil {
		// Do not leave a partial record behind.
		if terr := s.w.Truncate(ws.size); terr != nil {
			return fmt.Errorf("spool: append: %w (and truncating back: %v)", err, terr)
		}
		return fmt.Errorf("spool: append: %w", err)
	}
	m := meta{seg: ws.seq, off: ws.size, n: uint32(len(payload)), t: t}
	ws.size += need
	s.q = append(s.q, m)
	s.bytes += need
	s.st.Appended++
	close(s.notify)
	s.notify = make(chan struct{})
	if len(s.segs) > 1 {
		// Dropped records may have emptied old segments.
		return s.deleteDeadSegments()
	}
	return nil
}

// roll finishes the write segment (fsyncs it) and starts the next one.
func (s *Spool) roll() error {
	if err := s.fsync(s.w); err != nil {
		return fmt.Errorf("spool: sync segment: %w", err)
	}
	if err := s.w.Close(); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	s.w = nil
	if err := s.createSegment(s.segs[len(s.segs)-1].seq + 1); err != nil {
		// Keep appending to the old segment rather than lose the spool.
		f, oerr := os.OpenFile(s.segPath(s.segs[len(s.segs)-1].seq), os.O_RDWR|os.O_APPEND, 0o600)
		if oerr == nil {
			s.w = f
		}
		return err
	}
	return s.deleteDeadSegments()
}

// fileFor returns a handle to read segment seq.
func (s *Spool) fileFor(seq uint64) (*os.File, error) {
	if seq == s.segs[len(s.segs)-1].seq {
		return s.w, nil
	}
	if s.r != nil && s.rseq == seq {
		return s.r, nil
	}
	if s.r != nil {
		s.r.Close()
		s.r = nil
	}
	f, err := os.Open(s.segPath(seq))
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	s.r, s.rseq = f, seq
	return f, nil
}

// Peek returns the oldest waiting records, in order: at most max of them
// (max <= 0: no count limit) and, past the first, at most maxBytes of payload
// in all (maxBytes <= 0: no byte limit). Expired records are skipped and
// counted first. It returns nil when none waits. The same records are
// returned again until acked. Payloads are fresh copies owned by the caller.
//
// A record found damaged on disk while reading (the disk changed under the
// spool) is skipped and counted in Stats.Corrupt.
func (s *Spool) Peek(max int, maxBytes int) ([]Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	s.expire()
	for {
		recs, damaged, err := s.readFront(max, maxBytes)
		if err != nil {
			return nil, err
		}
		if damaged {
			s.removeFront(1)
			s.st.Corrupt++
			s.expire()
			continue
		}
		s.peekFirst = s.firstID
		s.peekN = len(recs)
		if err := s.deleteDeadSegments(); err != nil {
			return recs, err
		}
		return recs, nil
	}
}

// expire removes the expired records at the front.
func (s *Spool) expire() {
	if s.o.MaxAge <= 0 || s.waiting() == 0 {
		return
	}
	cutoff := s.now().Add(-s.o.MaxAge).UnixNano()
	k := 0
	for s.qh+k < len(s.q) && s.q[s.qh+k].t < cutoff {
		k++
	}
	if k > 0 {
		s.removeFront(k)
		s.st.Expired += uint64(k)
	}
}

// readFront reads the records Peek returns. damaged reports that the first
// waiting record could not be read back intact.
func (s *Spool) readFront(maxN, maxBytes int) ([]Record, bool, error) {
	w := s.waiting()
	if w == 0 {
		return nil, false, nil
	}
	if maxN <= 0 || maxN > w {
		maxN = w
	}
	// How many, by the byte limit.
	k, payload := 0, int64(0)
	for k < maxN {
		m := s.q[s.qh+k]
		if k > 0 && maxBytes > 0 && payload+int64(m.n) > int64(maxBytes) {
			break
		}
		payload += int64(m.n)
		k++
	}
	recs := make([]Record, 0, k)
	for i := 0; i < k; {
		// A run of records in the same segment is contiguous on disk.
		first := s.q[s.qh+i]
		j := i + 1
		for j < k && s.q[s.qh+j].seg == first.seg {
			j++
		}
		last := s.q[s.qh+j-1]
		span := last.off + last.size() - first.off
		f, err := s.fileFor(first.seg)
		if err != nil {
			return nil, false, err
		}
		buf := make([]byte, span)
		if nr, err := f.ReadAt(buf, first.off); err != nil {
			if errors.Is(err, io.EOF) {
				// Shorter than it was: what is missing is damaged.
				buf = buf[:nr]
			} else {
				return nil, false, fmt.Errorf("spool: read %s: %w", segName(first.seg), err)
			}
		}
		for ; i < j; i++ {
			m := s.q[s.qh+i]
			at := m.off - first.off
			if at+m.size() > int64(len(buf)) || !intact(buf[at:at+m.size()], m) {
				if len(recs) == 0 {
					return nil, true, nil
				}
				return recs, false, nil // return what precedes; the next Peek finds it first
			}
			recs = append(recs, Record{
				Payload:  buf[at+HeaderSize : at+m.size() : at+m.size()],
				Appended: time.Unix(0, m.t),
			})
		}
	}
	return recs, false, nil
}

func intact(rec []byte, m meta) bool {
	return binary.LittleEndian.Uint32(rec[0:]) == m.n &&
		int64(binary.LittleEndian.Uint64(rec[8:])) == m.t &&
		binary.LittleEndian.Uint32(rec[4:]) == crc32.Checksum(rec[HeaderSize:], castagnoli)
}

// Ack says the first n records the last Peek returned (less those acked
// since) were delivered: they leave the spool. Those of them that DropOldest
// dropped in the meantime are not waiting any more and are not counted again.
// n larger than what the last Peek returned (less those acked since) is an
// error.
func (s *Spool) Ack(n int) error {
	_, err := s.AckCount(n)
	return err
}

// AckCount is Ack, and says how many records it removed: fewer than n
// when DropOldest dropped some of the peeked ones meanwhile (those are
// counted in DroppedFull, not delivered).
func (s *Spool) AckCount(n int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	if n < 0 {
		return 0, fmt.Errorf("spool: ack %d: negative", n)
	}
	if n > s.peekN {
		return 0, fmt.Errorf("spool: ack %d: the last Peek returned %d records not yet acked", n, s.peekN)
	}
	end := s.peekFirst + uint64(n)
	s.peekFirst = end
	s.peekN -= n
	if end <= s.firstID {
		return 0, nil // all dropped already
	}
	k := int(end - s.firstID)
	if k > s.waiting() { // cannot happen: peeked records leave only from the front
		k = s.waiting()
	}
	s.removeFront(k)
	s.st.Acked += uint64(k)
	s.totalAcked += uint64(k)
	return k, s.deleteDeadSegments()
}

// Wait returns nil as soon as a record waits (immediately if one does),
// ctx.Err() when ctx ends, ErrClosed on Close.
func (s *Spool) Wait(ctx context.Context) error {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return ErrClosed
		}
		if s.waiting() > 0 {
			s.mu.Unlock()
			return nil
		}
		ch := s.notify
		s.mu.Unlock()
		select {
		case <-ch:
		case <-s.closedCh:
			return ErrClosed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Stats returns counters and the current size. After Close it returns the
// last values.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Waiting = s.waiting()
	st.Bytes = s.bytes
	if st.Waiting > 0 {
		st.Oldest = time.Unix(0, s.q[s.qh].t)
	}
	st.Segments = len(s.segs)
	return st
}

// Sync fsyncs the open segment and writes the cursor.
func (s *Spool) Sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return s.syncLocked()
}

func (s *Spool) syncLocked() error {
	if err := s.fsync(s.w); err != nil {
		return fmt.Errorf("spool: sync segment: %w", err)
	}
	var c cursor
	if s.waiting() > 0 {
		c.seq, c.off = s.q[s.qh].seg, s.q[s.qh].off
	} else {
		ws := s.segs[len(s.segs)-1]
		c.seq, c.off = ws.seq, ws.size
	}
	c.acked = s.totalAcked
	tmp := filepath.Join(s.dir, cursorTmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("spool: cursor: %w", err)
	}
	_, err = f.Write(encodeCursor(c))
	if err == nil {
		err = s.fsync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(s.dir, cursorName))
	}
	if err != nil {
		return fmt.Errorf("spool: cursor: %w", err)
	}
	// The rename, and segments created or deleted, are durable once the
	// directory is.
	d, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	err = s.fsync(d)
	d.Close()
	if err != nil {
		return fmt.Errorf("spool: sync dir: %w", err)
	}
	return nil
}

func (s *Spool) fsync(f *os.File) error {
	if s.o.noSync {
		return nil
	}
	return f.Sync()
}

// Close syncs, closes the files and releases the lock. Later calls return
// ErrClosed.
func (s *Spool) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	err := s.syncLocked()
	s.closeFiles()
	unlock(s.lock)
	s.closed = true
	close(s.closedCh)
	return err
}

func (s *Spool) closeFiles() {
	if s.w != nil {
		s.w.Close()
		s.w = nil
	}
	if s.r != nil {
		s.r.Close()
		s.r = nil
	}
}
