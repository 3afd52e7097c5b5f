package rtsp

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives the tests: every
// camera reader and every gortsplib client must be gone after Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
