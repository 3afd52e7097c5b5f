package dag

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/mdag/mdag/internal/yamlx"
)

// Clips is an app's event clips, declared under the app's `clips:`: each
// stream's recent video is kept encoded (H.264) in a bounded ring, and an
// event (of the kinds or rules in On) writes an MP4 from Pre before it to
// Post after it, with the event's JSON beside it. Events on a stream that
// fall inside a clip still being recorded extend that clip (up to
// MaxLength) instead of starting another. Package clips runs them.
type Clips struct {
	// Dir holds the clips (default: the service's --state directory, else
	// the user's cache directory, then clips/APP). Relative to the app file.
	Dir  string        `yaml:"dir" json:"dir,omitempty"`
	Pre  time.Duration `yaml:"pre" json:"pre"`   // video kept before the event (default 5s; 0 to 60s)
	Post time.Duration `yaml:"post" json:"post"` // video kept after the (last) event (default 5s; 0 to 60s)
	// On names the events that make clips: event kinds (line-cross, dwell,
	// loiter) or rule names of the app's activity modules. Empty: every
	// event.
	On []string `yaml:"on" json:"on,omitempty"`
	// MaxLength caps one clip: overlapping events extend a clip to at most
	// this long, then a new one starts (default 60s).
	MaxLength time.Duration `yaml:"max_length" json:"max_length"`
	// MaxBytes and MaxAge bound the directory: after each clip, the oldest
	// clips go until the rest fit; none older than MaxAge is kept.
	MaxBytes Bytes         `yaml:"max_bytes" json:"max_bytes"` // default 1GiB
	MaxAge   time.Duration `yaml:"max_age" json:"max_age"`     // default 168h
	// PerMinute caps the clips a stream starts in any minute; events past
	// it make no clip and are counted (default 6).
	PerMinute int `yaml:"max_clips_per_stream_per_minute" json:"max_clips_per_stream_per_minute"`
	// BitrateKbps is the clips' H.264 target bitrate (default 1000).
	BitrateKbps int `yaml:"bitrate_kbps" json:"bitrate_kbps"`

	// rolls: Pre and Post were defaulted before decoding (SetDefaults), so
	// each is its default unless given, and an explicit 0s stays 0.
	rolls bool
}

// ClipEventKinds are the event kinds the activity op makes.
var ClipEventKinds = []string{"line-cross", "dwell", "loiter"}

// Clip limits and defaults.
const (
	DefaultClipPre       = 5 * time.Second
	DefaultClipPost      = 5 * time.Second
	MaxClipRoll          = 60 * time.Second
	DefaultClipLength    = 60 * time.Second
	MaxClipLength        = 10 * time.Minute
	DefaultClipBytes     = 1 << 30
	MinClipBytes         = 1 << 20
	DefaultClipAge       = 168 * time.Hour
	DefaultClipPerMinute = 6
	MaxClipPerMinute     = 60
	DefaultClipBitrate   = 1000
)

var clipOnRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// SetDefaults sets Pre and Post to their defaults before the section is
// decoded (yamlx calls it): each given replaces its own, so `pre: 2s`
// keeps the default post, and `post: 0s` is no post-roll.
func (c *Clips) SetDefaults() {
	c.Pre, c.Post, c.rolls = DefaultClipPre, DefaultClipPost, true
}

// setDefaults fills the clips section's defaults (validate does, before
// checking). A section not decoded from YAML (built in Go) gets Pre and
// Post defaulted only when both are zero.
func (c *Clips) setDefaults() {
	if !c.rolls && c.Pre == 0 && c.Post == 0 {
		c.Pre, c.Post = DefaultClipPre, DefaultClipPost
	}
	c.rolls = true
	if c.MaxLength == 0 {
		c.MaxLength = max(DefaultClipLength, c.Pre+c.Post)
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultClipBytes
	}
	if c.MaxAge == 0 {
		c.MaxAge = DefaultClipAge
	}
	if c.PerMinute == 0 {
		c.PerMinute = DefaultClipPerMinute
	}
	if c.BitrateKbps == 0 {
		c.BitrateKbps = DefaultClipBitrate
	}
}

// ruleNames returns the rule names of the app's activity modules.
func (a *App) ruleNames() []string {
	var names []string
	for _, m := range a.Modules {
		if m.Op != "activity" {
			continue
		}
		rules, _ := m.Params["rules"].([]any)
		for _, r := range rules {
			if s, ok := r.(string); ok {
				if f := strings.Fields(s); len(f) > 1 {
					names = append(names, f[1])
				}
			}
		}
	}
	return names
}

// validateClips checks the clips section (defaults filled first).
func (a *App) validateClips(add func(path, format string, args ...any)) {
	c := a.Clips
	if c == nil {
		return
	}
	c.setDefaults()
	if a.Media != Video {
		add("clips", "clips are video: the app's media is %s", a.Media)
	}
	if c.Pre < 0 || c.Pre > MaxClipRoll {
		add("clips.pre", "%v: want 0 to %v", c.Pre, MaxClipRoll)
	}
	if c.Post < 0 || c.Post > MaxClipRoll {
		add("clips.post", "%v: want 0 to %v", c.Post, MaxClipRoll)
	}
	if c.MaxLength < c.Pre+c.Post || c.MaxLength > MaxClipLength {
		add("clips.max_length", "%v: want pre+post (%v) to %v", c.MaxLength, c.Pre+c.Post, MaxClipLength)
	}
	if c.MaxBytes < MinClipBytes || c.MaxBytes > MaxSpoolBytes {
		add("clips.max_bytes", "%v: want %v to %v", c.MaxBytes, Bytes(MinClipBytes), Bytes(MaxSpoolBytes))
	}
	if c.MaxAge < time.Minute {
		add("clips.max_age", "%v: want at least 1m", c.MaxAge)
	}
	if c.PerMinute < 1 || c.PerMinute > MaxClipPerMinute {
		add("clips.max_clips_per_stream_per_minute", "%d: want 1 to %d", c.PerMinute, MaxClipPerMinute)
	}
	if c.BitrateKbps < 100 || c.BitrateKbps > 50000 {
		add("clips.bitrate_kbps", "%d: want 100 to 50000", c.BitrateKbps)
	}
	known := append(slices.Clone(ClipEventKinds), a.ruleNames()...)
	for i, on := range c.On {
		at := fmt.Sprintf("clips.on[%d]", i)
		switch {
		case !clipOnRE.MatchString(on):
			add(at, "%q: want an event kind or a rule name", on)
		case !slices.Contains(known, on):
			add(at, "%q: not an event kind (%s) nor a rule of the app's activity modules%s", on, strings.Join(ClipEventKinds, ", "), yamlx.Suggest(on, known))
		case slices.Index(c.On, on) != i:
			add(at, "%q given twice", on)
		}
	}
}

// ClipOn reports whether an event of kind and rule makes a clip.
func (c *Clips) ClipOn(kind, rule string) bool {
	return len(c.On) == 0 || slices.Contains(c.On, kind) || slices.Contains(c.On, rule)
}
