module github.com/mdag/mdag

go 1.26.0

require (
	github.com/draffensperger/golp v0.0.0-20250721104811-2d405f0b4e68
	github.com/google/go-cmp v0.7.0
	go.uber.org/goleak v1.3.0
	gocv.io/x/gocv v0.31.0
	gopkg.in/yaml.v3 v3.0.1
	pgregory.net/rapid v1.3.0
)

require github.com/kr/text v0.2.0 // indirect
