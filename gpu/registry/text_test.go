package registry

import (
	"path/filepath"
	"strings"
	"testing"
)

// The text decoders' settings: db's defaults and ranges, ctc's keys file
// read with its non-ASCII blanks kept.
func TestTextDecoders(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "keys.txt", "a\n\u3000\nb \r\n")
	entry := func(dec string) string {
		return "models:\n  m:\n    format: onnx\n    file: m.onnx\n" +
			"    input: {name: x, dtype: float32, layout: NCHW, width: 320, height: 48, colour: bgr}\n" +
			"    max_batch: 8\n    decoder: " + dec + "\n"
	}
	r, err := Parse(filepath.Join(dir, "models.yaml"), []byte(entry("{name: db, threshold: 0.6}")))
	if err != nil {
		t.Fatal(err)
	}
	if p := r.Models["m"].Params(); p.Binarize != 0.3 || p.Unclip != 1.5 || p.Threshold != 0.6 {
		t.Errorf("db defaults: %+v, want binarize 0.3, unclip 1.5", p)
	}
	r, err = Parse(filepath.Join(dir, "models.yaml"), []byte(entry("{name: ctc, labels: keys.txt}")))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Models["m"].Labels; strings.Join(got, "|") != "a|\u3000|b" {
		t.Errorf("keys %q, want a, U+3000, b", got)
	}
	for dec, want := range map[string]string{
		"{name: db, binarize: 1.2}":               "decoder.binarize: 1.2: want > 0 and < 1",
		"{name: db, unclip: 9}":                   "decoder.unclip: 9: want 1..4",
		"{name: classify, unclip: 2}":             "binarize and unclip are for the db decoder",
		"{name: ctc}":                             "decoder.labels: missing: the ctc decoder needs the keys file",
		"{name: ctc, labels: nokeys.txt}":         "nokeys.txt",
		"{name: ctc, labels: keys.txt, space: 1}": "decoder.space: 1: want 0 (off) up to below 1",
		"{name: db, space: 0.1}":                  "decoder.space: only for the ctc decoder",
	} {
		if _, err := Parse(filepath.Join(dir, "models.yaml"), []byte(entry(dec))); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("decoder %s: %v, want %q", dec, err, want)
		}
	}
}
