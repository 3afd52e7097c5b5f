module github.com/mdag/mdag

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.0-1
	github.com/draffensperger/golp v0.0.0-20250721104811-2d405f0b4e68
	github.com/google/go-cmp v0.7.0
	go.uber.org/goleak v1.3.0
	gocv.io/x/gocv v0.31.0
	google.golang.org/grpc v1.77.0
	google.golang.org/protobuf v1.36.12
	gopkg.in/yaml.v3 v3.0.1
	pgregory.net/rapid v1.3.0
)

require (
	github.com/kr/text v0.2.0 // indirect
	golang.org/x/net v0.46.1-0.20251013234738-63d1a5100f82 // indirect
	golang.org/x/sys v0.37.0 // indirect
	golang.org/x/text v0.30.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20251022142026-3a174f9686a8 // indirect
	google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.0 // indirect
)

tool (
	google.golang.org/grpc/cmd/protoc-gen-go-grpc
	google.golang.org/protobuf/cmd/protoc-gen-go
)
