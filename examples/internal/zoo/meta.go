package zoo

// Meta is the title and description of a generated example README.
type Meta struct{ Title, About string }

// Examples lists the generated examples (scrooge-example is hand-written:
// it copies Scrooge's Tables 3 and 4 exactly).
var Examples = map[string]Meta{
	"traffic": {"traffic: traffic monitoring", `Scrooge's *traffic* mDAG (Figure 1; Section 4.1): SSD-Inception finds vehicles and people
in each frame, vehicles are cropped, classified by make/model and counted, people are cropped and
their faces recognised. The number of vehicles per frame (the scaling factor of crop-vehicles)
varies between 0 and 9 in Scrooge's videos (Figure 3a); 4 is the planning value here. Scrooge's
clients send 2-5 frames/s (Section 4.2); this example samples 10 so that one stream alone is
feasible under the worst-case batching model (at 5 frames/s every batch-1 stage waits up to 200 ms).

Live: ` + live("traffic")},
	"face": {"face: avatar extraction", `Scrooge's *face* mDAG (Figure 1): a face detector, a crop, and PRNet extracting facial
keypoints. Clients send 12-30 frames/s (Section 4.2).

Live: ` + live("face")},
	"tracker": {"tracker: person tracking", `Scrooge's *tracker* mDAG (Figure 1): a MobileNet SSD detects pedestrians, a Triplet network
embeds each for re-identification, and a stateful tracker associates them across frames. Clients
send 15-40 frames/s (Section 4.2).

Live: ` + live("tracker")},
	"pose": {"pose: human pose extraction", `Scrooge's *pose* mDAG (Figure 1): OpenPose finds each person's keypoints, a stateful window
keeps the recent poses of each stream, and an action recogniser classifies them.

Live: ` + live("pose")},
	"caption": {"caption: video captioning", `Scrooge's *caption* mDAG (Figure 1, Section 3.1): AlexNet features per frame, one stateful
CPU module that restores order and keeps context, and S2VT generating captions. S2VT runs at
batch size 1 only and takes 0.686-1.102 s per frame (Figure 3b); a full batch-1 instance waits
d + b/cap = 2d in the worst case, so the SLO is 2.5 s.

Live: ` + live("caption")},
	"audio": {"audio: language translation", `Scrooge's *audio* mDAG (Figure 1, after Rim): an audio stream cut into chunks, speech
recognition, English-to-German translation and speech synthesis in sequence. 25 chunks of 40 ms per
second.`},
	"actdet": {"actdet: complex activity detection", `Scrooge's *actdet* mDAG (Figure 1, after Caesar): people are detected and cropped, then tracked
(stateful, CPU) and re-identified (GPU) in parallel; an activity module joins both results of each
frame. The only fork-join example.

The activity module's rules (params in app.yaml): a line at x = 160 ("line-cross" events, the
direction as seen on the image) and a zone over x <= 80 ("dwell" after 2 s); the events come back
in each frame's result.

Live: ` + live("actdet")},
	"nexus-traffic": {"nexus-traffic: Nexus's traffic query", `Nexus's traffic application (Figure 8, Section 7.3.2): SSD detects objects, then GoogleNet-car
recognises cars and VGG-Face recognises faces; 400 ms SLO. Nexus's query analysis gives 345 of the
400 ms to SSD.`},
	"nexus-game": {"nexus-game: Nexus's game query", `Nexus's game analysis (Section 7.3.1): on every frame of a game stream, six numbers are read by
a LeNet specialised to the game's font and one icon by a ResNet-50; 50 ms SLO. Streams are sampled
at 60 frames/s (Nexus does not give the rate).`},
}

// live is how to run an app live, for its README.
func live(app string) string {
	return "`mdag serve --example " + app + " --synthetic 2` (the moving-shapes pattern, emulated GPUs), `mdag\n" +
		"client --app " + app + "` against a served app (WHIP), or `make demo APP=" + app + "`."
}
