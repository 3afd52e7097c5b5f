package main

import (
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/mdag/mdag/remote"
	"github.com/mdag/mdag/remote/wire"
)

// TestGRPCLimitFlags: the coordinator's limit flags become remote.Limits,
// and a value that cannot work is refused with the flag's name.
func TestGRPCLimitFlags(t *testing.T) {
	tests := []struct {
		args    []string
		want    func(remote.Limits) bool
		wantErr string
	}{
		{nil, func(l remote.Limits) bool {
			d := remote.DefaultLimits
			return l.MaxFrameW == 1920 && l.MaxFrameH == 1080 && l.MaxMessage == d.MaxMessage && l.MaxBoxes == d.MaxBoxes && l.MaxSourceStreams == d.MaxSourceStreams && l.PeerBurst == d.PeerBurst && l.GlobalRate == d.GlobalRate
		}, ""},
		{[]string{"--max-frame", "640x480", "--max-message", "8", "--max-source-streams", "2", "--register-rate", "0.5"}, func(l remote.Limits) bool {
			// the default audio cap shrinks to what a 640x480 source message holds
			return l.MaxFrameW == 640 && l.MaxFrameH == 480 && l.MaxMessage == 8<<20 && l.MaxSourceStreams == 2 && l.PeerRate == 0.5 &&
				l.MaxAudioBytes == 640*480*3+256*wire.MaxBoxBytes
		}, ""},
		{[]string{"--max-frame", "640x480", "--max-audio", "2048"}, nil, "--max-audio 2048 KiB does not fit a source's message"},
		{[]string{"--max-frame", "640"}, nil, "--max-frame: frame size \"640\": want WIDTHxHEIGHT"},
		{[]string{"--max-frame", "0x480"}, nil, "want WIDTHxHEIGHT with positive integers"},
		{[]string{"--max-frame", "20000x10"}, nil, "at most 16384 pixels a side"},
		{[]string{"--max-boxes", "0"}, nil, "--max-boxes 0: want > 0"},
		{[]string{"--register-burst", "-1"}, nil, "--register-burst -1: want > 0"},
		{[]string{"--max-message", "4"}, nil, "--max-message 4 MiB is smaller than one --max-frame 1920x1080 frame"},
		{[]string{"--max-message", "4096"}, nil, "at most 2047 MiB"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			lf := addGRPCLimitFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			l, err := lf.limits()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.want(l) {
				t.Fatalf("got %+v, %v", l, err)
			}
		})
	}
}
