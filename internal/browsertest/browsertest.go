// Package browsertest starts headless Chromium for tests through chromedp,
// with the flags a sandboxed CI machine needs and a fresh profile. Tests
// that drive the browser page (ingest/whip) and the dashboard (cmd/mdag)
// share it.
package browsertest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Path is where Debian's chromium package puts the browser.
const Path = "/usr/bin/chromium"

// New starts Chromium and returns a context for chromedp actions that ends
// after timeout or with the test. Without Chromium the test is skipped, or
// fails when MDAG_REQUIRE_INTEROP=1 (`make test` sets it: its deps install
// the browser). extra adds flags (fake camera, window size).
func New(t testing.TB, timeout time.Duration, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	if _, err := os.Stat(Path); err != nil {
		if os.Getenv("MDAG_REQUIRE_INTEROP") == "1" {
			t.Fatalf("chromium is required (MDAG_REQUIRE_INTEROP=1) but missing: %v (make deps installs it)", err)
		}
		t.Skipf("chromium not installed (%v); make deps installs it", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(Path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
	)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), append(opts, extra...)...)
	ctx, cancel := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, timeout)
	t.Cleanup(func() {
		cancelT()
		cancel()
		cancelA()
	})
	return ctx
}
