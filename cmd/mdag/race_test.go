//go:build race

package main

// raceEnabled: the tests run under the race detector (go test -race, as
// make test runs them), which makes Go code several times slower; tests
// that measure throughput against native code hold looser bounds then.
const raceEnabled = true
