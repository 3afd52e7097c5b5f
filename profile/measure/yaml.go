package measure

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mdag/mdag/profile"
)

// Entry is one profile written by YAML: the points, a comment per point
// (optional, e.g. SERF's thread count) and comment lines above it.
type Entry struct {
	Profile  profile.Profile
	Header   []string // comment lines above the entry
	Comments []string // per point, after it on its line ("" for none)
}

// YAML renders a profiles document with one worker type and the entries,
// in the flow style of the examples' profiles, that profile.Parse reads
// as is. Latencies are rounded to the microsecond.
func YAML(header []string, w profile.WorkerType, entries []Entry) []byte {
	var b bytes.Buffer
	for _, h := range header {
		comment(&b, "", h)
	}
	b.WriteString("workers:\n")
	fmt.Fprintf(&b, "  - {type: %s, price: %s", quote(string(w.Type)), num(w.Price))
	if w.GPU != "" {
		fmt.Fprintf(&b, ", gpu: %s, gpus: %d", quote(w.GPU), max(w.GPUs, 1))
	}
	if w.CPUs > 0 {
		fmt.Fprintf(&b, ", cpus: %d", w.CPUs)
	}
	if w.GPUMemory > 0 {
		fmt.Fprintf(&b, ", gpuMemory: %s", w.GPUMemory)
	}
	b.WriteString("}\nprofiles:\n")
	for _, e := range entries {
		for _, h := range e.Header {
			comment(&b, "  ", h)
		}
		fmt.Fprintf(&b, "  - target: %s\n    worker: %s\n    points:\n", quote(e.Profile.Target), quote(string(e.Profile.Worker)))
		for i, p := range e.Profile.Points {
			lat := max(p.Latency.Round(time.Microsecond), time.Microsecond)
			fmt.Fprintf(&b, "      - {batch: %d, concurrency: %d, latency: %s", p.Batch, p.Concurrency, lat)
			if p.Throughput > 0 {
				fmt.Fprintf(&b, ", throughput: %s", strconv.FormatFloat(p.Throughput, 'f', 3, 64))
			}
			b.WriteString("}")
			if i < len(e.Comments) && e.Comments[i] != "" {
				b.WriteString("  # " + oneLine(e.Comments[i]))
			}
			b.WriteString("\n")
		}
	}
	return b.Bytes()
}

func comment(b *bytes.Buffer, indent, s string) {
	for _, l := range strings.Split(printable(strings.ReplaceAll(s, "\r", "\n")), "\n") {
		b.WriteString(strings.TrimRight(indent+"# "+l, " ") + "\n")
	}
}

func oneLine(s string) string {
	return printable(strings.NewReplacer("\n", " ", "\r", " ").Replace(s))
}

// printable replaces what YAML does not allow in a comment (invalid UTF-8,
// control characters other than tab and newline, BOM, non-characters) with
// '?'.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '\t' || r == '\n':
			return r
		case r == utf8.RuneError, r < 0x20, r >= 0x7f && r <= 0x9f, r == 0xfeff, r == 0xfffe, r == 0xffff:
			return '?'
		}
		return r
	}, s)
}

func num(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// quote leaves plain names bare and double-quotes anything YAML could read
// otherwise.
func quote(s string) string {
	// plain: a letter or _ first, then letters, digits, _ - . (no
	// indicator first, no number)
	plain := s != ""
	for i, r := range s {
		letter := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '_'
		if !(letter || i > 0 && (r >= '0' && r <= '9' || r == '-' || r == '.')) {
			plain = false
		}
	}
	switch strings.ToLower(s) {
	case "true", "false", "yes", "no", "null", "on", "off", "~":
		plain = false
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		plain = false
	}
	if plain {
		return s
	}
	return strconv.Quote(s)
}
