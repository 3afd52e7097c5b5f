package squishy_test

import (
	"fmt"
	"testing"

	"github.com/mdag/mdag/placement/squishy"
)

// symphonyTable5 is Symphony Table 5 (1080Ti): alpha ms, beta ms, SLO ms.
var symphonyTable5 = []struct {
	name             string
	alpha, beta, slo float64
}{
	{"NASNetMobile", 0.570, 14.348, 33}, {"MobileNetV3Small", 0.335, 5.350, 20}, {"DenseNet169", 1.271, 13.618, 37},
	{"DenseNet121", 1.061, 10.312, 29}, {"DenseNet201", 1.733, 15.687, 45}, {"EfficientNetV2B0", 1.006, 7.493, 23},
	{"MobileNetV3Large", 0.820, 5.256, 20}, {"InceptionV3", 1.964, 8.771, 33}, {"EfficientNetV2B1", 1.661, 7.247, 27},
	{"ResNet50V2", 1.409, 5.947, 23}, {"ResNet152V2", 3.471, 13.049, 53}, {"ResNet101V2", 2.438, 9.095, 37},
	{"InceptionResNetV2", 5.090, 18.368, 77}, {"EfficientNetB0", 1.569, 5.586, 23}, {"MobileNetV2", 1.180, 3.483, 20},
	{"ResNet101", 3.164, 9.065, 43}, {"EfficientNetB1", 2.489, 6.674, 33}, {"ResNet50", 2.050, 5.378, 27},
	{"EfficientNetV2B2", 2.254, 5.896, 29}, {"VGG19", 3.059, 7.857, 40}, {"ResNet152", 4.599, 11.212, 59},
	{"MobileNet", 1.009, 2.390, 20}, {"VGG16", 2.734, 5.786, 33}, {"EfficientNetB2", 3.446, 5.333, 38},
	{"EfficientNetV2B3", 4.072, 5.981, 44}, {"NASNetLarge", 17.656, 18.952, 179}, {"EfficientNetV2S", 8.463, 8.862, 85},
	{"EfficientNetB3", 5.924, 4.849, 57}, {"EfficientNetV2L", 40.313, 28.208, 378}, {"EfficientNetV2M", 22.619, 14.786, 210},
	{"EfficientNetB5", 23.435, 10.301, 208}, {"Xception", 4.751, 2.046, 42}, {"SSDMobilenet", 23.778, 9.729, 209},
	{"EfficientNetB4", 12.088, 4.412, 105}, {"BERT", 7.008, 0.159, 56},
}

// uniformWorkload is n sessions over the Table 5 models (cycling), all at
// one rate chosen so that the lower bound is gpus GPUs.
func uniformWorkload(n int, gpus float64) []squishy.Session {
	var sessions []squishy.Session
	var inv float64 // sum of 1/T_i
	for i := 0; i < n; i++ {
		z := symphonyTable5[i%len(symphonyTable5)]
		p := squishy.LinearProfile(ms(z.alpha), ms(z.beta), 128)
		s := squishy.Session{ID: fmt.Sprintf("%s-%d", z.name, i), Model: z.name, SLO: ms(z.slo), Profile: p}
		best := 0
		for j := range p.Batches {
			if 2*p.Latency[j] <= s.SLO {
				best = j
			}
		}
		inv += p.Latency[best].Seconds() / float64(p.Batches[best])
		sessions = append(sessions, s)
	}
	for i := range sessions {
		sessions[i].Rate = gpus / inv
	}
	return sessions
}

// BenchmarkPack runs squishy bin packing over a grid of session counts and
// workload sizes (the lower bound in GPUs) and reports the packing
// efficiency: lower bound / GPUs used (Nexus: 84% on its workload).
//
//	go test ./placement/squishy -run '^$' -bench BenchmarkPack -benchtime 5x
func BenchmarkPack(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		for _, gpus := range []float64{1, 10, 100, 500} {
			b.Run(fmt.Sprintf("sessions=%d/bound=%g", n, gpus), func(b *testing.B) {
				sessions := uniformWorkload(n, gpus)
				var res squishy.PackResult
				for b.Loop() {
					res = squishy.Pack(sessions, squishy.PackOptions{})
				}
				if len(res.Unschedulable) > 0 {
					b.Fatalf("unschedulable: %+v", res.Unschedulable[0])
				}
				b.ReportMetric(res.Efficiency, "efficiency")
				b.ReportMetric(res.PackingEfficiency, "packing-eff")
				b.ReportMetric(float64(len(res.GPUs)), "GPUs")
			})
		}
	}
}
