package opus

import (
	"fmt"
	"testing"
)

// BenchmarkDecode decodes 20 ms frames of a tone, mono and stereo at 32
// and 64 kbit/s; rtf is the real-time factor: seconds of audio decoded
// per second of wall time.
func BenchmarkDecode(b *testing.B) {
	for _, channels := range []int{1, 2} {
		for _, bitrate := range []int{32000, 64000} {
			b.Run(fmt.Sprintf("ch%d/%dk", channels, bitrate/1000), func(b *testing.B) {
				_, pkts := encodeTone(b, channels, bitrate, 50)
				dec, err := NewDecoder(channels)
				if err != nil {
					b.Fatal(err)
				}
				defer dec.Close()
				b.ResetTimer()
				for i := range b.N {
					if _, err := dec.Decode(pkts[i%len(pkts)]); err != nil {
						b.Fatal(err)
					}
				}
				audio := float64(b.N) * 0.020
				b.ReportMetric(audio/b.Elapsed().Seconds(), "rtf")
			})
		}
	}
}
