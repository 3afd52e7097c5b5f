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

var nameRE = regexp.MustCompile(`^[0-9]{8}T[0-9]{9}Z-[A-Za-z0-9_-]+-[0-9]+\.mp4$`)

// OpenStore opens (making it) dir and indexes the clips there (NAME.mp4
// with NAME.json), then enforces the bounds.
func OpenStore(dir string, maxBytes int64, maxAge time.Duration, clk clock.Clock) (*Store, error) {
	if dir == "" {
		return nil, errors.New("clips: no directory")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("clips: %w", err)
	}
	s := &Store{dir: dir, maxBytes: maxBytes, maxAge: maxAge, clock: clk}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("clips: %w", err)
	}
	for _, e := range ents {
		if !nameRE.MatchString(e.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, strings.TrimSuffix(e.Name(), ".mp4")+".json"))
		var sc Sidecar
		if err == nil {
			err = json.Unmarshal(b, &sc)
		}
		if err != nil || sc.Clip.Name != e.Name() {
			return nil, fmt.Errorf("clips: %s: no readable NAME.json beside it (%v): remove it or its directory", filepath.Join(dir, e.Name()), err)
		}
		s.clips = append(s.clips, sc.Clip)
		s.bytes += sc.Clip.Bytes
	}
	slices.SortFunc(s.clips, func(a, b Info) int { return strings.Compare(a.Name, b.Name) })
	s.enforce()
	return s, nil
}

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

// Write writes a clip (its MP4, then its JSON, each through a temporary
// file renamed into place) and enforces the bounds.
func (s *Store) Write(first outputs.Body, events []outputs.Event, samples []Sample, last time.Duration) (Info, error) {
	if len(samples) == 0 {
		return Info{}, errors.New("clips: no samples")
	}
	start := samples[0].Capture.UTC()
	stream := unsafeRE.ReplaceAllString(first.Stream, "_")
	if len(stream) > 64 {
		stream = stream[:64]
	}
	base := fmt.Sprintf("%s-%s-%d", start.Format("20060102T150405.000Z"), stream, samples[0].Seq)
	base = strings.Replace(base, ".", "", 1)
	info := Info{Name: base + ".mp4", Stream: first.Stream, Start: start, Frames: len(samples), Events: events}
	for _, x := range samples[1:] {
		info.FramesDropped += x.Gap
	}
	mp4 := filepath.Join(s.dir, info.Name)
	f, err := os.CreateTemp(s.dir, ".clip-*")
	if err != nil {
		return Info{}, fmt.Errorf("clips: %w", err)
	}
	defer os.Remove(f.Name())
	err = WriteMP4(f, samples, last)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Info{}, err
	}
	st, err := os.Stat(f.Name())
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
	first.ID = base
	sc, err := json.MarshalIndent(Sidecar{Body: first, Clip: info}, "", "  ")
	if err != nil {
		return Info{}, fmt.Errorf("clips: %w", err)
	}
	if err := os.Rename(f.Name(), mp4); err != nil {
		return Info{}, fmt.Errorf("clips: %w", err)
	}
	if err := writeFile(filepath.Join(s.dir, base+".json"), append(sc, '\n')); err != nil {
		os.Remove(mp4)
		return Info{}, err
	}
	s.mu.Lock()
	s.clips = append(s.clips, info)
	slices.SortFunc(s.clips, func(a, b Info) int { return strings.Compare(a.Name, b.Name) })
	s.bytes += info.Bytes
	s.mu.Unlock()
	s.enforce()
	return info, nil
}

func writeFile(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".clip-*")
	if err != nil {
		return fmt.Errorf("clips: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("clips: %w", err)
	}
	return nil
}

// Enforce removes the oldest clips (MP4 and JSON) until the rest fit in
// the bytes and none is older than the age (by its start, on the clock).
func (s *Store) Enforce() { s.enforce() }

func (s *Store) enforce() {
	s.mu.Lock()
	defer s.mu.Unlock()
	cut := s.clock.Now().Add(-s.maxAge)
	for len(s.clips) > 0 && (s.bytes > s.maxBytes || s.clips[0].Start.Before(cut)) {
		c := s.clips[0]
		for _, p := range []string{c.Name, strings.TrimSuffix(c.Name, ".mp4") + ".json"} {
			if err := os.Remove(filepath.Join(s.dir, p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				// counted as gone all the same: a clip that cannot be removed
				// must not stop the rest from being bounded
				slog.Error("clips: retention: a clip's file not removed", "err", err)
			}
		}
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
}
