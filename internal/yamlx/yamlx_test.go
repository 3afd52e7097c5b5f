package yamlx_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mdag/mdag/internal/yamlx"
)

type inner struct {
	N    int            `yaml:"n"`
	Tags map[string]int `yaml:"tags"`
}

type doc struct {
	Name    string         `yaml:"name"`
	On      bool           `yaml:"on"`
	Ratio   float64        `yaml:"ratio"`
	Wait    time.Duration  `yaml:"wait"`
	Items   []inner        `yaml:"items"`
	Ptr     *inner         `yaml:"ptr"`
	Any     map[string]any `yaml:"any"`
	Skipped string         `yaml:"-"`
	Def     int            `yaml:"def"`
}

func (d *doc) SetDefaults() { d.Def = 7 }

func TestDecodeValid(t *testing.T) {
	src := `name: x
on: true
ratio: 2
wait: 1.5s
items:
  - {n: 1, tags: {a: 1}}
  - &shared {n: 0x10}
ptr: *shared
any: {k: [1, two]}
`
	var d doc
	pos, errs := yamlx.Decode("d.yaml", []byte(src), &d)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	want := doc{Name: "x", On: true, Ratio: 2, Wait: 1500 * time.Millisecond,
		Items: []inner{{N: 1, Tags: map[string]int{"a": 1}}, {N: 16}}, Ptr: &inner{N: 16},
		Any: map[string]any{"k": []any{1, "two"}}, Def: 7}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Error(diff)
	}
	for path, line := range map[string]int{"name": 1, "items[1].n": 7, "items[0].tags.a": 6, "items[9]": 5, "nope": 1} {
		if got := pos.Line(path); got != line {
			t.Errorf("Line(%q) = %d, want %d", path, got, line)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		src  string
		want string
	}{
		{"name: [a]\n", `d.yaml:1: name: want a string, got a list`},
		{"on: yes\n", `d.yaml:1: on: want true or false, got "yes"`},
		{"items: [{n: 99999999999999999999}]\n", "d.yaml:1: items[0].n: want an integer, got 99999999999999999999"},
		{"ratio: .nan\n", "d.yaml:1: ratio: want a finite number, got .nan"},
		{"ptr: 3\n", "d.yaml:1: ptr: want a mapping of fields, got 3"},
		{"items: [{tags: [1]}]\n", "d.yaml:1: items[0].tags: want a mapping, got a list"},
		{"items: [{tags: {a: 1, a: 2}}]\n", `d.yaml:1: items[0].tags.a: duplicate key "a"`},
		{"wait: ~\n", "d.yaml:1: wait: want a duration such as 400ms, got nothing (null)"},
		{"? [a]\n: 1\n", "d.yaml:1: keys must be plain names, got a list"},
		{"nmae: x\n", `d.yaml:1: nmae: unknown field "nmae" (did you mean "name"?)`},
		{"Skipped: x\n", `d.yaml:1: Skipped: unknown field "Skipped" (known fields: name, on, ratio, wait, items, ptr, any, def)`},
	}
	for _, tt := range tests {
		var d doc
		_, errs := yamlx.Decode("d.yaml", []byte(tt.src), &d)
		if errs.Error() != tt.want {
			t.Errorf("%q:\n got %s\nwant %s", tt.src, errs.Error(), tt.want)
		}
	}
}

func TestAllErrorsAtOnce(t *testing.T) {
	var d doc
	_, errs := yamlx.Decode("d.yaml", []byte("ratio: x\nitems: [{n: a}, {m: 1}]\non: 3\n"), &d)
	want := []string{
		`d.yaml:1: ratio: want a number, got "x"`,
		`d.yaml:2: items[0].n: want an integer, got "a"`,
		`d.yaml:2: items[1].m: unknown field "m" (known fields: n, tags)`,
		`d.yaml:3: on: want true or false, got 3`,
	}
	if diff := cmp.Diff(want, strings.Split(errs.Error(), "\n")); diff != "" {
		t.Error(diff)
	}
}

// TestAliasBomb checks that a "billion laughs" document is refused quickly.
func TestAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 10; i++ {
		b.WriteString("a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + string(rune('0'+i-1)))
		}
		b.WriteString("]\n")
	}
	var v map[string][]any
	_, errs := yamlx.Decode("bomb.yaml", []byte(b.String()), &v)
	if len(errs) == 0 {
		t.Fatal("alias bomb accepted")
	}
}

func TestMergeAndUnder(t *testing.T) {
	base := yamlx.ErrorList{{Path: "modules[1].inputs"}}
	more := yamlx.ErrorList{{Path: "modules[1].inputs[0]"}, {Path: "modules[10]"}, {Path: "modules"}}
	got := base.Merge(more)
	if len(got) != 3 || got[1].Path != "modules[10]" || got[2].Path != "modules" {
		t.Errorf("Merge = %v", got)
	}
	if yamlx.Under("modules[10]", "modules[1]") || !yamlx.Under("a.b", "a") || !yamlx.Under("x", "") {
		t.Error("Under is wrong")
	}
}
