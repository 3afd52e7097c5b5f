// Package yamlx decodes user-facing YAML strictly and reports every problem
// with its file, line and field path.
//
// It walks a yaml.v3 node tree with reflection instead of using yaml.v3's own
// decoder so that:
//   - unknown keys, duplicate keys and wrong types are all reported at once,
//     not just the first one;
//   - each problem names the field path (modules[2].inputs[0]) as well as the
//     line, which is what a user needs to find it;
//   - the caller gets a Positions table and can attach lines to the semantic
//     (validation) errors it finds later.
//
// Supported Go types: structs (fields by `yaml:"name"` tag), string, bool,
// signed integers, floats, time.Duration (Go syntax, a unit is required),
// slices, map[string]T, pointers, `any` (decoded by yaml.v3), and any type
// implementing Scalar.
package yamlx

import (
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Error is one problem found in a YAML document.
type Error struct {
	File string // file name as given by the caller; may be empty
	Line int    // 1-based; 0 when unknown
	Path string // field path such as modules[2].inputs[0]; empty for the document
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ErrorList is a list of problems; it is an error when non-empty.
type ErrorList []*Error

func (l ErrorList) Error() string {
	parts := make([]string, len(l))
	for i, e := range l {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "\n")
}

// Err returns nil for an empty list and the sorted list otherwise.
func (l ErrorList) Err() error {
	if len(l) == 0 {
		return nil
	}
	l.Sort()
	return l
}

// Merge appends the problems in more that no problem in l already explains:
// a later, semantic check of a field that failed to decode only adds noise.
func (l ErrorList) Merge(more ErrorList) ErrorList {
	out := l
	for _, m := range more {
		covered := false
		for _, e := range l {
			if e.Path != "" && Under(m.Path, e.Path) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, m)
		}
	}
	return out
}

// Sort orders the list by file, line and path, keeping equal entries stable.
func (l ErrorList) Sort() {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i], l[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Path < b.Path
	})
}

// Scalar is implemented by types decoded from one YAML scalar (for example
// byte sizes such as "16GiB").
type Scalar interface {
	UnmarshalScalar(s string) error
}

// Defaulter is implemented by structs that set their defaults before their
// fields are decoded.
type Defaulter interface {
	SetDefaults()
}

// Positions maps field paths of a decoded document to source lines.
type Positions struct {
	File  string
	lines map[string]int
}

// Line returns the line of path, or of its closest ancestor that has one.
func (p *Positions) Line(path string) int {
	if p == nil {
		return 0
	}
	for {
		if l, ok := p.lines[path]; ok {
			return l
		}
		if path == "" {
			return 0
		}
		path = parent(path)
	}
}

// Errorf builds an Error for path with its line.
func (p *Positions) Errorf(path, format string, args ...any) *Error {
	file := ""
	if p != nil {
		file = p.File
	}
	return &Error{File: file, Line: p.Line(path), Path: path, Msg: fmt.Sprintf(format, args...)}
}

func parent(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

// Under reports whether path is prefix itself or lies below it.
func Under(path, prefix string) bool {
	if prefix == "" || path == prefix {
		return true
	}
	return strings.HasPrefix(path, prefix) && (path[len(prefix)] == '.' || path[len(prefix)] == '[')
}

// maxNodes bounds the work done on one document, aliases included, so that
// a hostile document ("billion laughs") cannot exhaust memory.
const maxNodes = 200_000

var (
	durationType = reflect.TypeOf(time.Duration(0))
	scalarType   = reflect.TypeOf((*Scalar)(nil)).Elem()
)

type decoder struct {
	pos   *Positions
	errs  ErrorList
	nodes int
}

// Decode decodes one YAML document in data into v, which must be a non-nil
// pointer. It returns the positions of every decoded path and every problem
// found; the value is filled as far as possible even when there are problems.
func Decode(file string, data []byte, v any) (*Positions, ErrorList) {
	pos := &Positions{File: file, lines: map[string]int{}}
	d := &decoder{pos: pos}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return pos, ErrorList{{File: file, Msg: "empty document"}}
		}
		return pos, ErrorList{syntaxError(file, err)}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		line := extra.Line
		if err != nil {
			return pos, ErrorList{syntaxError(file, err)}
		}
		return pos, ErrorList{{File: file, Line: line, Msg: "more than one YAML document; put one document per file"}}
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		panic("yamlx.Decode: v must be a non-nil pointer")
	}
	node := &root
	if node.Kind == yaml.DocumentNode {
		if len(node.Content) == 0 {
			return pos, ErrorList{{File: file, Msg: "empty document"}}
		}
		node = node.Content[0]
	}
	d.value(node, rv.Elem(), "")
	d.errs.Sort()
	return pos, d.errs
}

func syntaxError(file string, err error) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.Index(rest, ":"); i > 0 {
			if n, err := strconv.Atoi(rest[:i]); err == nil {
				line = n
				msg = strings.TrimSpace(rest[i+1:])
			}
		}
	}
	return &Error{File: file, Line: line, Msg: "invalid YAML: " + msg}
}

func (d *decoder) errorf(n *yaml.Node, path, format string, args ...any) {
	d.errs = append(d.errs, &Error{File: d.pos.File, Line: n.Line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (d *decoder) value(n *yaml.Node, v reflect.Value, path string) {
	d.nodes++
	if d.nodes > maxNodes {
		if d.nodes == maxNodes+1 {
			d.errorf(n, path, "document too large or too deeply aliased (over %d nodes)", maxNodes)
		}
		return
	}
	if n.Kind == yaml.AliasNode {
		d.value(n.Alias, v, path)
		return
	}
	if _, ok := d.pos.lines[path]; !ok {
		d.pos.lines[path] = n.Line
	}
	if v.Kind() == reflect.Pointer {
		if isNull(n) {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.value(n, v.Elem(), path)
		return
	}
	if v.CanAddr() && v.Addr().Type().Implements(scalarType) {
		if n.Kind != yaml.ScalarNode || isNull(n) {
			d.errorf(n, path, "want a single value, got %s", describe(n))
			return
		}
		if err := v.Addr().Interface().(Scalar).UnmarshalScalar(n.Value); err != nil {
			d.errorf(n, path, "%v", err)
		}
		return
	}
	if v.Type() == durationType {
		d.duration(n, v, path)
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		d.structValue(n, v, path)
	case reflect.Slice:
		d.slice(n, v, path)
	case reflect.Map:
		d.mapValue(n, v, path)
	case reflect.Interface:
		var x any
		if err := n.Decode(&x); err != nil {
			d.errorf(n, path, "%v", err)
			return
		}
		if x != nil {
			v.Set(reflect.ValueOf(x))
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode || isNull(n) {
			d.errorf(n, path, "want a string, got %s", describe(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Bool:
		b, ok := scalarBool(n)
		if !ok {
			d.errorf(n, path, "want true or false, got %s", describe(n))
			return
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
			d.errorf(n, path, "want an integer, got %s", describe(n))
			return
		}
		i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
		if err != nil || v.OverflowInt(i) {
			d.errorf(n, path, "integer %s out of range", n.Value)
			return
		}
		v.SetInt(i)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
			d.errorf(n, path, "want a non-negative integer, got %s", describe(n))
			return
		}
		u, err := strconv.ParseUint(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
		if err != nil || v.OverflowUint(u) {
			d.errorf(n, path, "want a non-negative integer in range, got %s", n.Value)
			return
		}
		v.SetUint(u)
	case reflect.Float32, reflect.Float64:
		f, ok := scalarFloat(n)
		if !ok {
			d.errorf(n, path, "want a number, got %s", describe(n))
			return
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			d.errorf(n, path, "want a finite number, got %s", n.Value)
			return
		}
		v.SetFloat(f)
	default:
		panic(fmt.Sprintf("yamlx: unsupported type %s at %s", v.Type(), path))
	}
}

func (d *decoder) duration(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		d.errorf(n, path, "want a duration such as 400ms, got %s", describe(n))
		return
	}
	if tag := n.ShortTag(); tag == "!!int" || tag == "!!float" {
		d.errorf(n, path, "want a duration with a unit such as %sms, got %s", n.Value, n.Value)
		return
	}
	dur, err := time.ParseDuration(n.Value)
	if err != nil {
		d.errorf(n, path, "want a duration such as 400ms or 1.5s, got %q", n.Value)
		return
	}
	v.SetInt(int64(dur))
}

type fieldInfo struct {
	index []int
	name  string
}

func fields(t reflect.Type) ([]fieldInfo, map[string]int) {
	var out []fieldInfo
	byName := map[string]int{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		byName[name] = len(out)
		out = append(out, fieldInfo{index: f.Index, name: name})
	}
	return out, byName
}

func (d *decoder) structValue(n *yaml.Node, v reflect.Value, path string) {
	if v.CanAddr() {
		if def, ok := v.Addr().Interface().(Defaulter); ok {
			def.SetDefaults()
		}
	}
	if n.Kind != yaml.MappingNode {
		if isNull(n) {
			return
		}
		d.errorf(n, path, "want a mapping of fields, got %s", describe(n))
		return
	}
	infos, byName := fields(v.Type())
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.errorf(k, path, "keys must be plain names, got %s", describe(k))
			continue
		}
		name := k.Value
		fpath := join(path, name)
		idx, ok := byName[name]
		if !ok {
			d.errorf(k, fpath, "unknown field %q%s", name, suggest(name, infos))
			continue
		}
		if seen[name] {
			d.errorf(k, fpath, "duplicate field %q", name)
			continue
		}
		seen[name] = true
		d.pos.lines[fpath] = k.Line
		d.value(val, v.FieldByIndex(infos[idx].index), fpath)
	}
}

func (d *decoder) slice(n *yaml.Node, v reflect.Value, path string) {
	if isNull(n) {
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, path, "want a list, got %s", describe(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, c := range n.Content {
		d.value(c, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
	}
	v.Set(s)
}

func (d *decoder) mapValue(n *yaml.Node, v reflect.Value, path string) {
	if isNull(n) {
		return
	}
	if v.Type().Key().Kind() != reflect.String {
		panic("yamlx: only maps with string keys are supported")
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "want a mapping, got %s", describe(n))
		return
	}
	m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.errorf(k, path, "keys must be plain names, got %s", describe(k))
			continue
		}
		kv := reflect.New(v.Type().Key()).Elem()
		kv.SetString(k.Value)
		fpath := join(path, k.Value)
		if m.MapIndex(kv).IsValid() {
			d.errorf(k, fpath, "duplicate key %q", k.Value)
			continue
		}
		d.pos.lines[fpath] = k.Line
		ev := reflect.New(v.Type().Elem()).Elem()
		d.value(val, ev, fpath)
		m.SetMapIndex(kv, ev)
	}
	v.Set(m)
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func scalarBool(n *yaml.Node) (bool, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		return false, false
	}
	switch strings.ToLower(n.Value) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

func scalarFloat(n *yaml.Node) (float64, bool) {
	if n.Kind != yaml.ScalarNode {
		return 0, false
	}
	switch n.ShortTag() {
	case "!!int", "!!float":
	default:
		return 0, false
	}
	var f float64
	if err := n.Decode(&f); err != nil {
		return 0, false
	}
	return f, true
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		if isNull(n) {
			return "nothing (null)"
		}
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		switch n.ShortTag() {
		case "!!str":
			return strconv.Quote(v)
		default:
			return v
		}
	}
	return "an unexpected node"
}

// suggest names the closest known field, or lists them all when none is close.
func suggest(name string, infos []fieldInfo) string {
	names := make([]string, len(infos))
	for i, f := range infos {
		names[i] = f.name
	}
	if s := Suggest(name, names); s != "" {
		return s
	}
	return " (known fields: " + strings.Join(names, ", ") + ")"
}

// Suggest returns ` (did you mean "x"?)` for the candidate closest to name
// within two edits and fewer edits than name has characters (ties broken
// alphabetically), or "" when none is close.
func Suggest(name string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		d := levenshtein(strings.ToLower(name), strings.ToLower(c))
		if d >= len(name) {
			continue // replacing every character is no suggestion
		}
		if d < bestD || (d == bestD && best != "" && c < best) {
			best, bestD = c, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
