package wire

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/mdag/mdag/api"
	"github.com/mdag/mdag/media"
)

func TestAudioRoundTrip(t *testing.T) {
	a := &media.Audio{Rate: 48000, Channels: 2, PCM: []int16{0, -1, 32767, -32768, 5, 6}}
	got, err := IngestAudioFromPB(AudioToPB(a), 1<<20)
	if err != nil || got.Rate != a.Rate || got.Channels != a.Channels || len(got.PCM) != len(a.PCM) {
		t.Fatalf("%+v, %v", got, err)
	}
	for i := range a.PCM {
		if got.PCM[i] != a.PCM[i] {
			t.Fatalf("sample %d: %d, want %d", i, got.PCM[i], a.PCM[i])
		}
	}
	if AudioToPB(nil) != nil {
		t.Error("nil audio encoded")
	}
}

func TestAudioFromPBErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    *api.Audio
		max  int
		want string
	}{
		{"nil", nil, 100, "no audio"},
		{"over the cap", &api.Audio{Rate: 48000, Channels: 1, Pcm: make([]byte, 102)}, 100, "102 bytes of PCM, at most 100"},
		{"no rate", &api.Audio{Rate: 0, Channels: 1, Pcm: make([]byte, 2)}, 100, "0 Hz"},
		{"rate too high", &api.Audio{Rate: 400000, Channels: 1, Pcm: make([]byte, 2)}, 100, "400000 Hz"},
		{"3 channels", &api.Audio{Rate: 48000, Channels: 3, Pcm: make([]byte, 6)}, 100, "3 channels"},
		{"empty", &api.Audio{Rate: 48000, Channels: 1}, 100, "audio of 0 bytes"},
		{"odd bytes", &api.Audio{Rate: 48000, Channels: 1, Pcm: make([]byte, 3)}, 100, "audio of 3 bytes"},
		{"half a stereo sample", &api.Audio{Rate: 48000, Channels: 2, Pcm: make([]byte, 6)}, 100, "multiple of 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := IngestAudioFromPB(tc.p, tc.max)
			if err == nil || a != nil && err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("AudioFromPB = %v, %v; want an error saying %q", a, err, tc.want)
			}
			if tc.name == "over the cap" && !errors.Is(err, ErrAudioSize) {
				t.Errorf("%v is not ErrAudioSize", err)
			}
		})
	}
}

// FuzzDecodeAudio: arbitrary bytes as an IngestMessage's audio never
// crash the decoder, and what it accepts is a valid chunk within the cap.
func FuzzDecodeAudio(f *testing.F) {
	b, err := proto.Marshal(&api.IngestMessage{Seq: 3, Audio: AudioToPB(&media.Audio{Rate: 48000, Channels: 1, PCM: make([]int16, 960)})})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{0x32, 0x02, 0x08, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		var m api.IngestMessage
		if proto.Unmarshal(data, &m) != nil || m.Audio == nil {
			return
		}
		a, err := IngestAudioFromPB(m.Audio, 4096)
		if err != nil {
			return
		}
		if a.Valid() != nil || len(a.PCM) == 0 || 2*len(a.PCM) > 4096 {
			t.Fatalf("accepted %d Hz, %d channels, %d samples", a.Rate, a.Channels, len(a.PCM))
		}
	})
}
