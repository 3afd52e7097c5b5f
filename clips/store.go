package clips

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mdag/mdag/internal/clock"
	"github.com/mdag/mdag/outputs"
)

// Info describes a written clip: the JSON beside its MP4 (NAME.json) is
// the first event's message (outputs.Body, kind event) with a "clip"
// object added.
type Info struct {
	Name     string        `json:"name"` // NAME.mp4
	Stream   string        `json:"stream"`
	Start    time.Time     `json:"start"` // the first frame's capture
	Duration time.Duration `json:"duration_ns"`
	Seconds  float64       `json:"duration_s"`
	Frames   int           `json:"frames"`
	// FramesDropped are the stream's frames within the clip that were not
	// recorded (the stream's encoder was behind, or failed): the clip
	// skips them, its samples' durations span the gaps.
	FramesDropped int             `json:"frames_dropped"`
	Bytes         int64           `json:"bytes"`
	Events        []outputs.Event `json:"events"` // every event the clip holds, the first first
}

// Sidecar is NAME.json.
type Sidecar struct {
	outputs.Body
	Clip Info `json:"clip"`
}

// Store is a directory of clips, bounded by bytes and age.
type Store struct {
	dir      string
	maxBytes int64
	maxAge   time.Duration
	clock    clock.Clock
	log      *slog.Logger
	skipped  int

	mu      sync.Mutex
	clips   []Info // oldest first
	bytes   int64
	removed Removal
}

// Removal counts the clips retention removed.
type Removal struct {
	Clips, Bytes int64
	ForBytes     int64 // clips removed to fit the bytes
	ForAge       int64 // clips removed as older than the age
}

// nameRE is a clip's name: its start, its stream (sanitised; "_" when
// nothing is left), its first frame's seq, the event's seq, and a
// counter when that name was taken.
var nameRE = regexp.MustCompile(`^[0-9]{8}T[0-9]{9}Z-[A-Za-z0-9_-]+-[0-9]+\.mp4$`)

// tempPrefix starts the store's temporary files (removed on open: a
// crash's leftovers).
const tempPrefix = ".clip-"

// OpenStore opens (making it) dir and indexes the clips there (NAME.mp4
// with NAME.json), then enforces the bounds. A clip it cannot read is
// skipped (counted, logged), not served, and left in place; leftover
// temporary files and JSONs without their MP4 (a crash between the two)
// are removed.
func OpenStore(dir string, maxBytes int64, maxAge time.Duration, clk clock.Clock) (*Store, error) {
	return openStore(dir, maxBytes, maxAge, clk, slog.Default())
}

func openStore(dir string, maxBytes int64, maxAge time.Duration, clk clock.Clock, log *slog.Logger) (*Store, error) {
	if dir == "" {
		return nil, errors.New("clips: no directory")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("clips: %w", err)
	}
	s := &Store{dir: dir, maxBytes: maxBytes, maxAge: maxAge, clock: clk, log: log}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("clips: %w", err)
	}
	have := map[string]bool{}
	for _, e := range ents {
		have[e.Name()] = true
	}
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, tempPrefix) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				log.Warn("clips: a leftover temporary file not removed", "file", filepath.Join(dir, name), "err", err)
			}
			continue
		}
		if base, ok := strings.CutSuffix(name, ".json"); ok && nameRE.MatchString(base+".mp4") && !have[base+".mp4"] {
			// written before its MP4, which a crash (or a retention run cut
			// short) left out: no clip
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				log.Warn("clips: a JSON without its MP4 not removed", "file", filepath.Join(dir, name), "err", err)
			}
			continue
		}
		if !nameRE.MatchString(name) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, strings.TrimSuffix(name, ".mp4")+".json"))
		var sc Sidecar
		if err == nil {
			err = json.Unmarshal(b, &sc)
		}
		if err == nil && sc.Clip.Name != name {
			err = fmt.Errorf("its clip.name is %q", sc.Clip.Name)
		}
		if err != nil {
			s.skipped++
			log.Warn("clips: a clip without a readable NAME.json beside it: skipped (not listed, not served, not counted against max_bytes)",
				"file", filepath.Join(dir, name), "err", err, "note", "remove it, or fix its JSON, and restart")
			continue
		}
		s.clips = append(s.clips, sc.Clip)
		s.bytes += sc.Clip.Bytes
	}
	slices.SortFunc(s.clips, func(a, b Info) int { return strings.Compare(a.Name, b.Name) })
	s.enforce()
	return s, nil
}

// Skipped is how many clips on disk OpenStore could not read.
func (s *Store) Skipped() int { return s.skipped }

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Removed returns what retention removed.
func (s *Store) Removed() Removal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removed
}

// Usage returns the clips on disk and their bytes.
func (s *Store) Usage() (int, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.clips), s.bytes
}

// List returns the clips, newest first.
func (s *Store) List() []Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.clips)
	slices.Reverse(out)
	return out
}

// Path returns the file of the clip named name (NAME.mp4 or NAME.json).
func (s *Store) Path(name string) (string, Info, bool) {
	base := strings.TrimSuffix(name, ".json")
	if base != name {
		base += ".mp4"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.clips {
		if c.Name == base {
			return filepath.Join(s.dir, name), c, true
		}
	}
	return "", Info{}, false
}

var unsafeRE = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// Write writes a clip, its JSON first, then its MP4 (each through a
// temporary file, synced, then linked into place: an existing file is
// never replaced), syncs the directory, and enforces the bounds. A crash
// between the two leaves a JSON without its MP4, which OpenStore removes.
// The name is NAME-SEQ-EVENTSEQ (start, stream, first frame, event); a
// name taken gets -2, -3, ... after it.
func (s *Store) Write(first outputs.Body, events []outputs.Event, samples []Sample, last time.Duration) (Info, error) {
	if len(samples) == 0 {
		return Info{}, errors.New("clips: no samples")
	}
	start := samples[0].Capture.UTC()
	stream := unsafeRE.ReplaceAllString(first.Stream, "_")
	if len(stream) > 64 {
		stream = stream[:64]
	}
	if stream == "" {
		stream = "_"
	}
	stem := fmt.Sprintf("%s-%s-%d-%d", start.Format("20060102T150405.000Z"), stream, samples[0].Seq, first.Seq)
	stem = strings.Replace(stem, ".", "", 1)
	info := Info{Stream: first.Stream, Start: start, Frames: len(samples), Events: events}
	for _, x := range samples[1:] {
		info.FramesDropped += x.Gap
	}
	tmp, err := tempFile(s.dir, func(f *os.File) error { return WriteMP4(f, samples, last) })
	if err != nil {
		return Info{}, err
	}
	defer os.Remove(tmp)
	st, err := os.Stat(tmp)
	if err != nil {
		return Info{}, fmt.Errorf("clips: %w", err)
	}
	info.Bytes = st.Size()
	info.Duration = samples[len(samples)-1].Capture.Sub(samples[0].Capture)
	if len(samples) > 1 {
		info.Duration += samples[len(samples)-1].Capture.Sub(samples[len(samples)-2].Capture)
	} else {
		info.Duration += last
	}
	info.Seconds = info.Duration.Seconds()
	for n := 1; ; n++ {
		if n > 1000 {
			return Info{}, fmt.Errorf("clips: %s: no free name", stem)
		}
		base := stem
		if n > 1 {
			base = fmt.Sprintf("%s-%d", stem, n)
		}
		info.Name = base + ".mp4"
		if s.has(info.Name) {
			continue
		}
		first.ID = base
		sc, err := json.MarshalIndent(Sidecar{Body: first, Clip: info}, "", "  ")
		if err != nil {
			return Info{}, fmt.Errorf("clips: %w", err)
		}
		js := filepath.Join(s.dir, base+".json")
		err = writeNew(js, append(sc, '\n'))
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return Info{}, err
		}
		err = linkNew(tmp, filepath.Join(s.dir, info.Name))
		if err != nil {
			os.Remove(js)
			if errors.Is(err, fs.ErrExist) {
				continue
			}
			return Info{}, fmt.Errorf("clips: %w", err)
		}
		break
	}
	syncDir(s.dir)
	s.mu.Lock()
	s.clips = append(s.clips, info)
	slices.SortFunc(s.clips, func(a, b Info) int { return strings.Compare(a.Name, b.Name) })
	s.bytes += info.Bytes
	s.mu.Unlock()
	s.enforce()
	return info, nil
}

// has reports whether the store lists a clip named name.
func (s *Store) has(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.ContainsFunc(s.clips, func(c Info) bool { return c.Name == name })
}

// tempFile writes a temporary file in dir with fill, synced and closed,
// and returns its path (the caller removes it).
func tempFile(dir string, fill func(*os.File) error) (string, error) {
	f, err := os.CreateTemp(dir, tempPrefix+"*")
	if err != nil {
		return "", fmt.Errorf("clips: %w", err)
	}
	err = fill(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("clips: %w", err)
	}
	return f.Name(), nil
}

// writeNew writes b to path, which must not exist (fs.ErrExist if it does).
func writeNew(path string, b []byte) error {
	tmp, err := tempFile(filepath.Dir(path), func(f *os.File) error { _, err := f.Write(b); return err })
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := linkNew(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return err
		}
		return fmt.Errorf("clips: %w", err)
	}
	return nil
}

// linkNew puts the file at tmp at path too, failing with fs.ErrExist if
// path exists (a hard link never replaces one). Where links are not
// supported, it renames, after checking path is free.
func linkNew(tmp, path string) error {
	err := os.Link(tmp, path)
	if err == nil || errors.Is(err, fs.ErrExist) {
		return err
	}
	if _, serr := os.Lstat(path); serr == nil {
		return fs.ErrExist
	}
	return os.Rename(tmp, path)
}

// syncDir makes the directory's new entries durable (best effort).
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// Enforce removes the oldest clips (MP4 and JSON) until the rest fit in
// the bytes and none is older than the age (by its start, on the clock).
// The files are removed after the index is updated, without its lock.
func (s *Store) Enforce() { s.enforce() }

func (s *Store) enforce() {
	s.mu.Lock()
	cut := s.clock.Now().Add(-s.maxAge)
	var gone []Info
	for len(s.clips) > 0 && (s.bytes > s.maxBytes || s.clips[0].Start.Before(cut)) {
		c := s.clips[0]
		gone = append(gone, c)
		s.clips = s.clips[1:]
		s.bytes -= c.Bytes
		s.removed.Clips++
		s.removed.Bytes += c.Bytes
		if c.Start.Before(cut) {
			s.removed.ForAge++
		} else {
			s.removed.ForBytes++
		}
	}
	s.mu.Unlock()
	for _, c := range gone {
		// the MP4 first: a JSON left alone is removed on open
		for _, p := range []string{c.Name, strings.TrimSuffix(c.Name, ".mp4") + ".json"} {
			if err := os.Remove(filepath.Join(s.dir, p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				// counted as gone all the same: a clip that cannot be removed
				// must not stop the rest from being bounded
				s.log.Error("clips: retention: a clip's file not removed", "err", err)
			}
		}
	}
}
