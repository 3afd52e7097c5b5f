package remote

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/dag"
	"github.com/mdag/mdag/media"
	"github.com/mdag/mdag/profile"
	"github.com/mdag/mdag/remote/wire"
)

// ingestApp is ingestOnce into app.
func ingestApp(cl api.CoordinatorClient, app, s string, msgs ...*api.IngestMessage) (*api.IngestReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := cl.Ingest(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range append([]*api.IngestMessage{{Join: &api.Join{App: app, Stream: s}}}, msgs...) {
		if err := st.Send(m); err != nil {
			break // the server ended the stream; CloseAndRecv says why
		}
	}
	return st.CloseAndRecv()
}

// audioApp is the audio example without its CPU op (segment): its GPU
// models in sequence from the source, and their profiles.
func audioApp(t *testing.T) (*dag.App, *profile.File) {
	t.Helper()
	app, prof := loadExample(t, "audio")
	app.Modules = slices.DeleteFunc(app.Modules, func(m dag.Module) bool { return m.Kind != dag.GPU })
	app.Modules[0].Inputs = []dag.ModuleID{dag.Source}
	prof.Profiles = slices.DeleteFunc(prof.Profiles, func(p profile.Profile) bool { return p.Target == "segment" })
	return app, prof
}

// TestIngestAudio: a source's audio chunks reach an audio app's session
// (IngestAudio); a chunk over MaxAudioBytes ends the stream, refused and
// counted; malformed chunks, audio into a video app and a message with
// both a frame and audio are rejected with the reason, the stream going
// on.
func TestIngestAudio(t *testing.T) {
	audio, prof := audioApp(t)
	c := startServer(t, audio, prof, &Server{Heartbeat: time.Second, Limits: Limits{MaxAudioBytes: 7680}}) // 80 ms of 48 kHz mono
	traffic, tprof := loadExample(t, "traffic")
	if err := c.e.Deploy(traffic, tprof); err != nil {
		t.Fatal(err)
	}
	cl := api.NewCoordinatorClient(c.cc)
	now := time.Now().UnixNano()
	chunk := func(samples, channels int) *api.Audio {
		return wire.AudioToPB(&media.Audio{Rate: 48000, Channels: channels, PCM: make([]int16, samples*channels)})
	}
	for _, tc := range []struct {
		name      string
		app       string
		msgs      []*api.IngestMessage
		code      codes.Code
		want      string // the error (code not OK) or the reply's last error
		accepted  uint64
		rejected  uint64
		refusedAs string
	}{
		{"chunks", "audio", []*api.IngestMessage{{Seq: 1, CaptureUnixNs: now, Audio: chunk(1920, 1)}, {Seq: 2, CaptureUnixNs: now, Audio: chunk(1920, 2)}}, codes.OK, "", 2, 0, ""},
		{"over the cap", "audio", []*api.IngestMessage{{Seq: 1, CaptureUnixNs: now, Audio: chunk(3841, 1)}}, codes.InvalidArgument,
			"ingest stream s frame 1: an audio chunk of 7682 bytes of PCM; a source may send at most 7680", 0, 0, RefusedAudioSize},
		{"odd bytes", "audio", []*api.IngestMessage{{Seq: 1, Audio: &api.Audio{Rate: 48000, Channels: 1, Pcm: make([]byte, 3)}}, {Seq: 2, CaptureUnixNs: now, Audio: chunk(960, 1)}},
			codes.OK, "frame 1: audio of 3 bytes: want a positive multiple of 2", 1, 1, ""},
		{"no rate", "audio", []*api.IngestMessage{{Seq: 1, Audio: &api.Audio{Channels: 1, Pcm: make([]byte, 2)}}}, codes.OK, "0 Hz", 0, 1, ""},
		{"audio into a video app", "traffic", []*api.IngestMessage{{Seq: 1, CaptureUnixNs: now, Audio: chunk(960, 1)}}, codes.OK, "app traffic takes video, not audio", 0, 1, ""},
		{"both", "audio", []*api.IngestMessage{{Seq: 1, Audio: chunk(960, 1), Frame: &api.Frame{Width: 4, Height: 4, Bgr: make([]byte, 48)}}}, codes.OK, "both a frame and audio", 0, 1, ""},
		{"neither", "audio", []*api.IngestMessage{{Seq: 1}}, codes.OK, "no frame and no audio", 0, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := c.srv.Refused()[tc.refusedAs]
			r, err := ingestApp(cl, tc.app, "s", tc.msgs...)
			if status.Code(err) != tc.code {
				t.Fatalf("got %v, want %v", err, tc.code)
			}
			if tc.code != codes.OK {
				if !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want it to say %q", err, tc.want)
				}
				if got := c.srv.Refused()[tc.refusedAs]; got != before+1 {
					t.Errorf("%s refusals went %d -> %d, want one more", tc.refusedAs, before, got)
				}
				return
			}
			if r.Accepted != tc.accepted || r.Rejected != tc.rejected || !strings.Contains(r.LastError, tc.want) {
				t.Errorf("reply %+v: want %d accepted, %d rejected, last error saying %q", r, tc.accepted, tc.rejected, tc.want)
			}
		})
	}
}
