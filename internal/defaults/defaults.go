// Package defaults fills the zero fields of a code config with their
// defaults and reports the fields out of range by name, so that a
// negative timeout or a headroom below 1 is an error, not a value silently
// replaced. It imports nothing of mdag's.
package defaults

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Fields collects the problems of one config; Prefix names it in each
// ("coordinator.Config").
type Fields struct {
	Prefix string
	errs   []error
}

// Bad records field = v as out of range, wanting want.
func (c *Fields) Bad(field string, v any, want string) {
	c.errs = append(c.errs, fmt.Errorf("%s.%s = %v: %s", c.Prefix, field, v, want))
}

// Duration: 0 takes def, a negative value is refused.
func (c *Fields) Duration(field string, d *time.Duration, def time.Duration) {
	switch {
	case *d < 0:
		c.Bad(field, *d, "must be >= 0 (0: the default "+def.String()+")")
	case *d == 0:
		*d = def
	}
}

// Count: 0 takes def, a negative value is refused.
func (c *Fields) Count(field string, n *int, def int) {
	switch {
	case *n < 0:
		c.Bad(field, *n, fmt.Sprintf("must be >= 0 (0: the default %d)", def))
	case *n == 0:
		*n = def
	}
}

// AtLeast checks a factor: 0 takes def; NaN, infinities and values below
// lo (or equal to it, when strict) are refused.
func (c *Fields) AtLeast(field string, f *float64, lo, def float64, strict bool) {
	switch {
	case *f == 0:
		*f = def
	case math.IsNaN(*f) || math.IsInf(*f, 0) || *f < lo || (strict && *f == lo):
		op := ">="
		if strict {
			op = ">"
		}
		c.Bad(field, *f, fmt.Sprintf("must be %s %g (0: the default %g)", op, lo, def))
	}
}

// Between checks a number in [0, hi] (hi <= 0: no upper bound): 0 takes
// def, NaN and values outside are refused.
func (c *Fields) Between(field string, f *float64, def, hi float64) {
	switch {
	case *f < 0 || math.IsNaN(*f) || (hi > 0 && *f > hi):
		want := "must be >= 0"
		if hi > 0 {
			want = fmt.Sprintf("must be between 0 and %g", hi)
		}
		c.Bad(field, *f, fmt.Sprintf("%s (0: the default %g)", want, def))
	case *f == 0:
		*f = def
	}
}

// Err joins the problems recorded (nil when none).
func (c *Fields) Err() error { return errors.Join(c.errs...) }
