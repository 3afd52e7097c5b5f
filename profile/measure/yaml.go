package measure

import (
	"bytes"
	"errors"
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

// Document is a profiles document as `mdag profile` writes it: comment
// lines, the plan (nil: no plan: line, the defaults), one worker type and
// the entries.
type Document struct {
	Header  []string
	Plan    *profile.Plan
	Worker  profile.WorkerType
	Entries []Entry
}

// YAML renders a profiles document with one worker type and the entries,
// in the flow style of the examples' profiles, that profile.Parse reads
// as is (Document.YAML without a plan: line).
func YAML(header []string, w profile.WorkerType, entries []Entry) []byte {
	return Document{Header: header, Worker: w, Entries: entries}.YAML()
}

// YAML renders the document. Batch times are rounded to the microsecond,
// to 10 ns below 100 µs (a CPU op's item can take less than one).
func (d Document) YAML() []byte {
	var b bytes.Buffer
	for _, h := range d.Header {
		comment(&b, "", h)
	}
	if d.Plan != nil {
		b.WriteString(planLine(*d.Plan))
	}
	b.WriteString("workers:\n")
	b.WriteString(workerLine(d.Worker))
	b.WriteString("profiles:\n")
	writeEntries(&b, d.Entries)
	return b.Bytes()
}

func planLine(p profile.Plan) string {
	parts := []string{"quantile: " + string(p.Quantile)}
	if !p.Frame.IsZero() {
		parts = append(parts, "frame: "+p.Frame.String())
	}
	return "plan: {" + strings.Join(parts, ", ") + "}\n"
}

func workerLine(w profile.WorkerType) string {
	var b strings.Builder
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
	b.WriteString("}\n")
	return b.String()
}

func writeEntries(b *bytes.Buffer, entries []Entry) {
	for _, e := range entries {
		for _, h := range e.Header {
			comment(b, "  ", h)
		}
		fmt.Fprintf(b, "  - target: %s\n    worker: %s\n", quote(e.Profile.Target), quote(string(e.Profile.Worker)))
		if !e.Profile.Frame.IsZero() {
			fmt.Fprintf(b, "    frame: %s\n", e.Profile.Frame)
		}
		b.WriteString("    points:\n")
		for i, p := range e.Profile.Points {
			lat := dur(p.Latency)
			fmt.Fprintf(b, "      - {batch: %d, concurrency: %d, latency: %s", p.Batch, p.Concurrency, lat)
			if p.P99 > 0 {
				fmt.Fprintf(b, ", p99: %s", max(dur(p.P99), lat))
			}
			if p.Throughput > 0 {
				fmt.Fprintf(b, ", throughput: %s", strconv.FormatFloat(p.Throughput, 'f', 3, 64))
			}
			b.WriteString("}")
			if i < len(e.Comments) && e.Comments[i] != "" {
				b.WriteString("  # " + oneLine(e.Comments[i]))
			}
			b.WriteString("\n")
		}
	}
}

// dur rounds a batch time for the document: to the microsecond, to 10 ns
// below 100 µs; never below 10 ns (a latency must be > 0).
func dur(d time.Duration) time.Duration {
	if d < 100*time.Microsecond {
		return max(d.Round(10*time.Nanosecond), 10*time.Nanosecond)
	}
	return d.Round(time.Microsecond)
}

// ErrLayout is returned by Document.AppendTo for a file that is not laid
// out as `mdag profile` writes: comment lines, then top-level keys with
// `workers:` and `profiles:` each on a line of its own, profiles last.
var ErrLayout = errors.New("not laid out as mdag profile writes a profiles document")

// AppendTo adds the document to old, a profiles document `mdag profile`
// wrote, keeping old's text as it is: d's header lines go after old's
// leading comments, d's worker type after old's when old lacks it (when
// old has it, it must be the same), d's entries after old's. d's plan must
// match old's where d has one. The result must parse: a second profile
// for the same target, worker type and frame size is an error, as in any
// profiles document. file names old in errors.
func (d Document) AppendTo(file string, old []byte) ([]byte, error) {
	of, err := profile.Parse(file, old)
	if err != nil {
		return nil, err
	}
	lines := strings.SplitAfter(string(old), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if !strings.HasSuffix(lines[len(lines)-1], "\n") {
		lines[len(lines)-1] += "\n"
	}
	head, workers, profiles := 0, -1, -1
	for head < len(lines) && strings.HasPrefix(lines[head], "#") {
		head++
	}
	for i := head; i < len(lines); i++ {
		switch strings.TrimRight(lines[i], " \r\n") {
		case "workers:":
			workers = i
		case "profiles:":
			profiles = i
		}
		if i > profiles && profiles >= 0 && lines[i] != "" && lines[i][0] != ' ' && lines[i][0] != '#' && lines[i][0] != '\n' {
			return nil, fmt.Errorf("%s: line %d: %w (profiles: must be the last top-level key)", file, i+1, ErrLayout)
		}
	}
	if workers < 0 || profiles < workers {
		return nil, fmt.Errorf("%s: %w (no top-level workers: line followed by a profiles: line)", file, ErrLayout)
	}
	if d.Plan != nil && *d.Plan != of.Plan {
		return nil, fmt.Errorf("%s plans on %s; this document says %s: append with the same plan",
			file, strings.TrimSpace(planLine(of.Plan)), strings.TrimSpace(planLine(*d.Plan)))
	}
	w := d.Worker
	if w.GPU != "" && w.GPUs == 0 {
		w.GPUs = 1
	}
	ow, have := of.Worker(w.Type)
	if have && ow != w {
		return nil, fmt.Errorf("%s has worker type %s as %s; this document says %s: append with the same worker type",
			file, w.Type, strings.TrimSpace(strings.TrimPrefix(workerLine(ow), "  - ")), strings.TrimSpace(strings.TrimPrefix(workerLine(w), "  - ")))
	}
	var b bytes.Buffer
	b.WriteString(strings.Join(lines[:head], ""))
	for _, h := range d.Header {
		comment(&b, "", h)
	}
	b.WriteString(strings.Join(lines[head:profiles], ""))
	if !have {
		b.WriteString(workerLine(w))
	}
	b.WriteString(strings.Join(lines[profiles:], ""))
	writeEntries(&b, d.Entries)
	out := b.Bytes()
	if _, err := profile.Parse(file, out); err != nil {
		return nil, fmt.Errorf("appended to %s, the document does not parse:\n%w", file, err)
	}
	return out, nil
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
