package modules

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/mdag/mdag/media"
)

// Stateful is implemented by the processors of ops that keep per-stream
// state (Op.Stateful). The runtime gives such a module stream affinity:
// every frame of a stream goes to the one instance holding its state, in
// frame order, one frame at a time per stream (never two frames of one
// stream at once; different streams may run concurrently, so the
// processor locks its map of streams). When a re-plan moves the module,
// the runtime exports each stream's state from the old instance
// (Snapshot, then Restore(stream, nil) there) and imports it on the new
// one (Restore), so the state follows the stream.
type Stateful interface {
	// ProcessFrame runs one frame of stream: items are all of the frame's
	// items that reached the module (at least one), in the order they were
	// produced. It returns the frame's outputs. Frames come in increasing
	// seq order; a gap (seq jumps) means the frames between were dropped
	// upstream or produced nothing for this module.
	ProcessFrame(stream string, seq uint64, items []*media.Item) ([]*media.Item, error)
	// Snapshot serialises stream's state (EncodeState's envelope); a
	// stream the processor has never seen gives a valid empty state.
	Snapshot(stream string) ([]byte, error)
	// Restore replaces stream's state with a Snapshot's bytes; nil or empty
	// forgets the stream (its next frame starts fresh). A snapshot of
	// another op, an unknown version or corrupt bytes is an error and
	// leaves the stream fresh.
	Restore(stream string, state []byte) error
	// Close releases what the processor holds.
	Close()
}

// stateMagic starts every state snapshot.
const stateMagic = "MDST"

// maxStateBytes bounds a snapshot (a tracker of a busy scene is a few KiB).
const maxStateBytes = 16 << 20

// EncodeState wraps an op's serialised state in the snapshot envelope:
// magic, envelope version 1, the op's name, the op's own state version, the
// payload's length and a CRC-32 of everything before it, then the payload.
func EncodeState(op OpID, version uint16, payload []byte) []byte {
	b := make([]byte, 0, len(stateMagic)+1+1+len(op)+2+4+len(payload)+4)
	b = append(b, stateMagic...)
	b = append(b, 1, byte(len(op)))
	b = append(b, op...)
	b = binary.BigEndian.AppendUint16(b, version)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, payload...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

// ErrState is wrapped by every DecodeState error.
var ErrState = errors.New("bad state snapshot")

// DecodeState opens a snapshot made by EncodeState for op and returns its
// state version and payload. It never panics on any input.
func DecodeState(op OpID, b []byte) (version uint16, payload []byte, err error) {
	fail := func(format string, args ...any) (uint16, []byte, error) {
		return 0, nil, fmt.Errorf("%w for op %s: %s", ErrState, op, fmt.Sprintf(format, args...))
	}
	if len(b) > maxStateBytes {
		return fail("%d bytes, more than the %d allowed", len(b), maxStateBytes)
	}
	if len(b) < len(stateMagic)+2+2+4+4 || string(b[:len(stateMagic)]) != stateMagic {
		return fail("not a snapshot (%d bytes, no %q header)", len(b), stateMagic)
	}
	if sum := binary.BigEndian.Uint32(b[len(b)-4:]); sum != crc32.ChecksumIEEE(b[:len(b)-4]) {
		return fail("checksum mismatch: the bytes were damaged")
	}
	p := b[len(stateMagic):]
	if p[0] != 1 {
		return fail("envelope version %d, this binary reads 1", p[0])
	}
	n := int(p[1])
	p = p[2:]
	if len(p) < n+2+4+4 {
		return fail("truncated")
	}
	if name := OpID(p[:n]); name != op {
		return fail("a snapshot of op %q", name)
	}
	p = p[n:]
	version = binary.BigEndian.Uint16(p)
	size := binary.BigEndian.Uint32(p[2:])
	p = p[6 : len(p)-4]
	if uint64(size) != uint64(len(p)) {
		return fail("payload says %d bytes, has %d", size, len(p))
	}
	return version, p, nil
}
