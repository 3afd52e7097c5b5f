//go:build !race

package main

// raceEnabled: the tests run without the race detector (race_test.go).
const raceEnabled = false
