package defaults

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestFields(t *testing.T) {
	c := Fields{Prefix: "x.Config"}
	d, neg := time.Duration(0), -time.Second
	n, bad := 0, -2
	f, low, nan, big, strictLo := 0.0, 0.5, math.NaN(), 2.0, 1.0
	c.Duration("D", &d, time.Second)
	c.Duration("Neg", &neg, time.Second)
	c.Count("N", &n, 7)
	c.Count("Bad", &bad, 7)
	c.AtLeast("F", &f, 1, 1.25, false)
	c.AtLeast("Low", &low, 1, 1.25, false)
	c.AtLeast("NaN", &nan, 1, 1.25, false)
	c.AtLeast("Strict", &strictLo, 1, 1.25, true)
	c.Between("Big", &big, 0.7, 1)
	if d != time.Second || n != 7 || f != 1.25 {
		t.Errorf("defaults: %v %d %g", d, n, f)
	}
	err := c.Err()
	for _, w := range []string{"x.Config.Neg = -1s: must be >= 0 (0: the default 1s)", "x.Config.Bad = -2: must be >= 0 (0: the default 7)",
		"x.Config.Low = 0.5: must be >= 1 (0: the default 1.25)", "x.Config.NaN = NaN", "x.Config.Strict = 1: must be > 1",
		"x.Config.Big = 2: must be between 0 and 1 (0: the default 0.7)"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v lacks %q", err, w)
		}
	}
	if (&Fields{}).Err() != nil {
		t.Error("no problems, an error")
	}
}
