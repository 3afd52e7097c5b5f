// Package spool is a bounded, on-disk, ordered spool (a write-ahead queue)
// for messages waiting to be delivered to a broker or webhook, at least once.
//
// One appender and one deliverer share a Spool: the appender calls Append,
// the deliverer loops on Wait, Peek, delivers, then Ack. The owner calls Sync
// periodically (e.g. every second) and Close at the end. All methods are safe
// for concurrent use. The package uses only the standard library and flock(2),
// so it builds on Unix systems.
//
// # On-disk format
//
// Dir holds:
//
//   - segment files named by a zero-padded 20-digit sequence number plus
//     ".seg" (00000000000000000001.seg, ...). A segment is a plain run of
//     records, each a 16-byte little-endian header followed by the payload:
//
//     uint32 payload length
//     uint32 CRC-32C (Castagnoli) of the payload
//     int64  appended time, Unix nanoseconds
//     [length]byte payload
//
//     A segment rolls over to the next sequence number when the next record
//     would take it past SegmentBytes (a segment holding a single record may be
//     larger). Segments whose records have all left the spool are deleted.
//
//   - "cursor", 36 bytes: the magic "MDSPCUR1", uint64 segment number, int64
//     offset of the first waiting record in that segment (or of the end of the
//     segment when none waits), uint64 lifetime count of acked records, and a
//     CRC-32C of the preceding 32 bytes. It is written to "cursor.tmp",
//     fsynced and renamed over "cursor" (then the directory is fsynced). A
//     cursor that is missing, short or fails its checksum is ignored: every
//     record on disk is then delivered again (at least once).
//
//   - "lock", held with flock(2) (LOCK_EX|LOCK_NB) while a Spool is open; it
//     contains the pid of the holder. A second Open of the same Dir, from
//     this or another process, fails with ErrLocked.
//
// # Durability
//
// Append writes the whole record with one write(2) call and keeps nothing
// buffered in user space, so a process crash loses nothing appended. Nothing
// is fsynced by Append except a segment being rolled over, which is fsynced
// once as it is finished. Sync fsyncs the open segment and writes the cursor;
// Close calls Sync. After an operating-system crash, records appended since
// the last Sync may be lost, and records acked (or dropped, or expired) since
// the last Sync may be delivered again: duplicates, never the loss of a synced
// record that was not acked. (Acked records whose segment was already deleted
// are simply not delivered again.)
//
// Open scans every segment to rebuild the counts and bytes. Records before the
// cursor are acked. A damaged or truncated record at the end of the last
// segment (a torn write) is truncated away and counted in Stats.Corrupt; a
// damaged record inside a segment (bad checksum, impossible length) makes the
// rest of that segment unreadable: it is skipped and counted once. A record
// length is checked against MaxBytes and the file size before anything is
// read, so a hostile or corrupt file cannot make Open allocate memory; payloads
// are checksummed in fixed 32 KiB chunks. Open writes a fresh cursor once the
// scan is done.
//
// # Limits
//
// MaxBytes bounds the bytes of waiting records, header included (Stats.Bytes);
// it frees as records are acked. When an Append would exceed it, WhenFull
// decides: DropOldest (the default) drops the oldest waiting records until the
// new one fits, DropNewest refuses the new record with ErrFull, and every
// later one until a record leaves (acked or expired): what is kept is a
// prefix of what came, never a smaller record slipped in after a larger
// one was refused. A record
// larger than MaxBytes on its own is always an error (ErrTooLarge). Acked
// records stay on disk until their whole segment is acked, so disk usage may
// exceed MaxBytes by at most one segment (the segment being read: SegmentBytes,
// or one single record when that is larger). If MaxBytes is lowered between
// runs, Open drops the oldest records to fit under DropOldest; under
// DropNewest it keeps them and refuses appends until they drain.
//
// MaxAge drops records older than it when they would be read: Peek skips them
// and counts them in Stats.Expired. They still count as waiting until then, so
// Wait may return for a record that Peek then skips.
//
// Memory: the spool keeps 32 bytes of metadata per waiting record; payloads
// are read from disk by Peek.
//
// # Acks and drops
//
// Ack(n) refers to the first n records that the last Peek returned (and not
// yet acked by an earlier Ack). Records are identified by position in the
// append order, so when DropOldest dropped some of them between Peek and Ack,
// Ack only removes those of the n that are still waiting: nothing is acked
// twice and no record that was not peeked is acked. n larger than what the
// last Peek returned (less what was acked since) is an error.
package spool
