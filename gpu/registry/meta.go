package registry

import (
	"fmt"
	"strconv"
	"strings"
)

// Ultralytics is what an Ultralytics export (YOLOv5u, YOLOv8, YOLO11,
// RT-DETR, ...) writes into the model's metadata_props: its class names
// (a Python dict literal, {0: 'person', 1: 'bicycle', ...}), the input
// size it was exported at (imgsz, [height, width]), the largest stride,
// the task (detect, pose, segment, classify, obb) and the batch size.
type Ultralytics struct {
	Names  []string // by class index
	Height int      // imgsz (0 when absent)
	Width  int
	Stride int
	Task   string
	Batch  int
}

// Ultralytics reads the graph's Ultralytics metadata: ok when the model
// says it is one (author Ultralytics, or names with stride or imgsz). A
// malformed entry is an error naming its key.
func (g *Graph) Ultralytics() (u Ultralytics, ok bool, err error) {
	author, _ := g.Meta("author")
	names, hasNames := g.Meta("names")
	_, hasStride := g.Meta("stride")
	_, hasSize := g.Meta("imgsz")
	if !strings.Contains(strings.ToLower(author), "ultralytics") && !(hasNames && (hasStride || hasSize)) {
		return u, false, nil
	}
	var errs []string
	if hasNames {
		if u.Names, err = PythonNames(names); err != nil {
			errs = append(errs, fmt.Sprintf("metadata names: %v", err))
		}
	}
	if s, ok := g.Meta("imgsz"); ok {
		v, err := pythonInts(s)
		switch {
		case err != nil:
			errs = append(errs, fmt.Sprintf("metadata imgsz %q: %v", s, err))
		case len(v) == 1:
			u.Height, u.Width = v[0], v[0]
		case len(v) == 2:
			u.Height, u.Width = v[0], v[1]
		default:
			errs = append(errs, fmt.Sprintf("metadata imgsz %q: want [height, width]", s))
		}
	}
	for _, f := range []struct {
		key string
		v   *int
	}{{"stride", &u.Stride}, {"batch", &u.Batch}} {
		if s, ok := g.Meta(f.key); ok {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				errs = append(errs, fmt.Sprintf("metadata %s %q: not an integer", f.key, s))
			}
			*f.v = n
		}
	}
	u.Task, _ = g.Meta("task")
	if len(errs) > 0 {
		return u, true, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return u, true, nil
}

// PythonNames reads class names written as a Python literal: a dict of
// index to name ({0: 'person', 1: "traffic light"}: the indices must be
// 0..n-1, in any order) or a list (['person', 'car']).
func PythonNames(s string) ([]string, error) {
	p := &pyLex{s: s}
	p.space()
	switch {
	case p.eat('['):
		var out []string
		for p.space(); !p.eat(']'); p.space() {
			v, err := p.str()
			if err != nil {
				return nil, err
			}
			out = append(out, v)
			p.space()
			if !p.eat(',') && p.peek() != ']' {
				return nil, p.errorf("want , or ]")
			}
		}
		return out, p.end()
	case p.eat('{'):
		byIndex := map[int]string{}
		for p.space(); !p.eat('}'); p.space() {
			k, err := p.int()
			if err != nil {
				return nil, err
			}
			if _, dup := byIndex[k]; dup {
				return nil, p.errorf("index %d given twice", k)
			}
			p.space()
			if !p.eat(':') {
				return nil, p.errorf("want :")
			}
			p.space()
			v, err := p.str()
			if err != nil {
				return nil, err
			}
			byIndex[k] = v
			p.space()
			if !p.eat(',') && p.peek() != '}' {
				return nil, p.errorf("want , or }")
			}
		}
		if err := p.end(); err != nil {
			return nil, err
		}
		out := make([]string, len(byIndex))
		for i := range out {
			v, ok := byIndex[i]
			if !ok {
				return nil, fmt.Errorf("indices are not 0..%d: %d is missing", len(out)-1, i)
			}
			out[i] = v
		}
		return out, nil
	}
	return nil, p.errorf("want a dict {0: 'name', ...} or a list ['name', ...]")
}

// pythonInts reads a list of integers ([640, 480], (640, 480)) or one.
func pythonInts(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	s = strings.TrimSuffix(strings.TrimPrefix(s, "("), ")")
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not an integer", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no integers")
	}
	return out, nil
}

type pyLex struct {
	s string
	i int
}

func (p *pyLex) errorf(format string, a ...any) error {
	return fmt.Errorf("at offset %d of %q: %s", p.i, abbrev(p.s), fmt.Sprintf(format, a...))
}

func abbrev(s string) string {
	if len(s) > 60 {
		return s[:57] + "..."
	}
	return s
}

func (p *pyLex) space() {
	for p.i < len(p.s) && strings.IndexByte(" \t\r\n", p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *pyLex) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *pyLex) eat(c byte) bool {
	if p.peek() == c && p.i < len(p.s) {
		p.i++
		return true
	}
	return false
}

func (p *pyLex) end() error {
	p.space()
	if p.i != len(p.s) {
		return p.errorf("trailing text")
	}
	return nil
}

func (p *pyLex) int() (int, error) {
	j := p.i
	for j < len(p.s) && p.s[j] >= '0' && p.s[j] <= '9' {
		j++
	}
	n, err := strconv.Atoi(p.s[p.i:j])
	if err != nil {
		return 0, p.errorf("want a class index")
	}
	p.i = j
	return n, nil
}

// str reads a quoted string, '...' or "...", with Python's backslash
// escapes (\\, \', \", \n, \t, \xHH, \uHHHH).
func (p *pyLex) str() (string, error) {
	q := p.peek()
	if q != '\'' && q != '"' {
		return "", p.errorf("want a quoted name")
	}
	p.i++
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == q:
			p.i++
			return b.String(), nil
		case c == '\\' && p.i+1 < len(p.s):
			e := p.s[p.i+1]
			p.i += 2
			switch e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'x', 'u':
				n := map[byte]int{'x': 2, 'u': 4}[e]
				if p.i+n > len(p.s) {
					return "", p.errorf("short \\%c escape", e)
				}
				v, err := strconv.ParseUint(p.s[p.i:p.i+n], 16, 32)
				if err != nil {
					return "", p.errorf("bad \\%c escape", e)
				}
				b.WriteRune(rune(v))
				p.i += n
			default:
				b.WriteByte(e)
			}
		default:
			b.WriteByte(c)
			p.i++
		}
	}
	return "", p.errorf("unterminated string")
}
