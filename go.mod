module github.com/mdag/mdag

go 1.26

require (
	github.com/google/go-cmp v0.7.0
	gopkg.in/yaml.v3 v3.0.1
)

require (
	github.com/draffensperger/golp v0.0.0-20250721104811-2d405f0b4e68 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)
