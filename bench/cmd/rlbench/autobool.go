package main

import (
	"fmt"

	"github.com/rlpipe/rlpipe/spec"
)

// autoBoolFlag is a flag for a spec.AutoBool: true, false or auto. Given
// without a value it is true, as a boolean flag is.
type autoBoolFlag struct{ v *spec.AutoBool }

// String returns the value as the spec writes it.
func (f autoBoolFlag) String() string {
	if f.v == nil {
		return "auto"
	}
	return f.v.String()
}

// Set parses true, false or auto.
func (f autoBoolFlag) Set(s string) error {
	switch s {
	case "true":
		*f.v = spec.AutoBoolOf(true)
	case "false":
		*f.v = spec.AutoBoolOf(false)
	case "auto":
		*f.v = spec.BoolAuto
	default:
		return fmt.Errorf("want true, false or auto, got %q", s)
	}
	return nil
}

// IsBoolFlag lets the flag be given without a value.
func (autoBoolFlag) IsBoolFlag() bool { return true }
