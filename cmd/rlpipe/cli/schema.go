package cli

import (
	"context"
	"fmt"

	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
)

func cmdSchema(_ context.Context, env *cli, args []string) int {
	fs := newFlagSet("schema", `Usage: rlpipe schema

Prints the JSON Schema (draft-07) of the job spec on stdout: every key with
its type, bounds, enum values and default, and for each stage kind this
binary registers (plugins included) the keys of its with: block. Editors
use it to complete and check specs as you type; see "Editor support" in
docs/spec.md. rlpipe validate checks everything the schema does and more.

  rlpipe schema > rlpipe.schema.json
`)
	if code, ok := parseFlags(fs, env, args); !ok {
		return code
	}
	out, err := spec.JSONSchema(schemaKinds())
	if err != nil {
		fmt.Fprintf(env.stderr, "rlpipe schema: %v\n", err)
		return exitFailed
	}
	env.stdout.Write(out)
	return exitOK
}

// schemaKinds returns the registered stage kinds as the schema describes
// them, each with its parameter struct holding its defaults.
func schemaKinds() []spec.SchemaKind {
	var kinds []spec.SchemaKind
	for _, k := range stages.Kinds() {
		kinds = append(kinds, spec.SchemaKind{Name: k.Name, Phase: k.Phase, Doc: k.Doc, Params: k.New()})
	}
	return kinds
}
