package decode

import (
	"fmt"
	"strings"

	"github.com/mdag/mdag/media"
)

// CTC decodes a CTC text recogniser, such as PaddleOCR's PP-OCR rec
// models: one output [T,C] of per-timestep class probabilities (a softmax
// over C), class 0 the CTC blank and class i > 0 the character on line i
// of the keys file (Params.Labels, the registry's decoder labels: one
// character a line). C may be one more than the keys plus the blank:
// PaddleOCR's use_space_char appends " " as the last class.
//
// Greedy decoding: the best class per timestep, repeats collapsed, blanks
// dropped. With a space class and Params.Space > 0, a run of blanks
// between two characters in which the space class reaches Space reads as
// one space: recognisers trained mostly on text written without spaces
// (PP-OCR's Chinese models) seldom make the space the best class between
// two words, but give it a clear share there and almost none between the
// letters of a word (on the text-reader clip: 0.07 to 0.49 in word gaps,
// under 0.01 inside words). The confidence is the mean of the kept timesteps' best
// probabilities (PaddleOCR's). A string is kept when it is not empty and
// its confidence reaches Threshold (PaddleOCR's drop_score: 0.5): it is
// the item's one label, and one box covering the whole input, of that
// class, carries its confidence (a crop's text and score: modules' place
// op puts it back onto the frame at the crop's region).
func CTC(outs []Output, g Geometry, p Params) (Result, error) {
	if len(outs) != 1 {
		return Result{}, fmt.Errorf("ctc: want 1 output (class probabilities [T,C]), have %d", len(outs))
	}
	o := outs[0]
	if len(o.Shape) != 2 || o.Shape[0] < 1 || o.Shape[1] < 2 || int64(len(o.Data)) != size(o.Shape) {
		return Result{}, fmt.Errorf("ctc: output %s has %d values for shape %v, want [T,C]", o.Name, len(o.Data), o.Shape)
	}
	t, c := int(o.Shape[0]), int(o.Shape[1])
	keys := len(p.Labels)
	if keys == 0 {
		return Result{}, fmt.Errorf("ctc: no keys (the decoder's labels: the keys file, one character a line)")
	}
	space := c == keys+2
	if c != keys+1 && !space {
		return Result{}, fmt.Errorf("ctc: output %s has %d classes; the keys file has %d (want keys + 1 for the blank, or + 2 with a trailing space class)", o.Name, c, keys)
	}
	if p.Space > 0 && !space {
		return Result{}, fmt.Errorf("ctc: space %g is set but output %s has no space class (%d classes: the blank and the %d keys)", p.Space, o.Name, c, keys)
	}
	var sb strings.Builder
	var sum float64
	n, prev := 0, 0
	last := byte(0) // the last byte written: a gap after a space adds none
	var gap float32 // the space class's peak in the blanks since the last character
	for i := range t {
		row := o.Data[i*c : (i+1)*c]
		best, bp := 0, row[0]
		for j, v := range row[1:] {
			if v > bp {
				best, bp = j+1, v
			}
		}
		if best == 0 {
			if space {
				gap = max(gap, row[c-1])
			}
		} else if best != prev {
			if best <= keys {
				if p.Space > 0 && gap >= float32(p.Space) && sb.Len() > 0 && last != ' ' {
					sb.WriteByte(' ')
				}
				sb.WriteString(p.Labels[best-1])
				last = 0
			} else if sb.Len() > 0 && last != ' ' {
				sb.WriteByte(' ')
				last = ' '
			}
			sum += float64(bp)
			n++
			gap = 0
		}
		prev = best
	}
	text := strings.TrimRight(sb.String(), " ")
	if n == 0 || text == "" {
		return Result{}, nil
	}
	conf := sum / float64(n)
	if conf < p.Threshold {
		return Result{}, nil
	}
	return Result{Labels: []string{text}, Boxes: []media.Box{{W: g.FrameW, H: g.FrameH, Class: text, Score: float32(conf)}}}, nil
}
