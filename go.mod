module github.com/rlpipe/rlpipe

go 1.26.8

require (
	github.com/NVIDIA/go-nvml v0.13.0-1
	github.com/expr-lang/expr v1.17.8
	github.com/google/uuid v1.6.0
	github.com/mattn/go-isatty v0.0.20
	github.com/rs/zerolog v1.35.1
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/sys v0.29.0
)

require github.com/mattn/go-colorable v0.1.14 // indirect
