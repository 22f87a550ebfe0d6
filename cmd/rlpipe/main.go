// Command rlpipe validates, plans and runs RL post-training pipelines
// described by a YAML job spec. See the README and `rlpipe help`.
package main

import (
	"os"

	"github.com/rlpipe/rlpipe/cmd/rlpipe/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
