package spec

import (
	"fmt"
	"reflect"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// AutoInt is an integer parameter that may also be written `auto`: rlpipe
// chooses the value when it plans the job, and the plan says what it chose
// and why. Written numbers are never negative; Auto stands for `auto`.
type AutoInt int

// Auto is the AutoInt written `auto`.
const Auto AutoInt = -1

// IsAuto reports whether the parameter was written `auto` (or left to its
// auto default).
func (a AutoInt) IsAuto() bool { return a == Auto }

// String returns "auto" or the number.
func (a AutoInt) String() string {
	if a.IsAuto() {
		return "auto"
	}
	return strconv.Itoa(int(a))
}

// MarshalJSON writes "auto" or the number.
func (a AutoInt) MarshalJSON() ([]byte, error) {
	if a.IsAuto() {
		return []byte(`"auto"`), nil
	}
	return []byte(strconv.Itoa(int(a))), nil
}

var autoIntType = reflect.TypeFor[AutoInt]()

// isAutoWord reports whether n is the string auto (quoted or not).
func isAutoWord(n *yaml.Node) bool {
	return n != nil && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && n.Value == "auto"
}

// autoIntValue decodes `auto` or a non-negative integer.
func (d *decoder) autoIntValue(n *yaml.Node, path string) (AutoInt, bool) {
	n = resolve(n)
	if isAutoWord(n) {
		return Auto, true
	}
	bigInt := n != nil && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" && bigIntRE.MatchString(n.Value)
	if !bigInt && (n == nil || n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int") {
		d.errorf(n, "%s", label(path, "want an integer or auto, got "+describe(n)))
		return 0, false
	}
	v, ok := d.intValue(n, path, strconv.IntSize)
	if !ok {
		return 0, false
	}
	if v < 0 {
		d.errorf(n, "%s", label(path, fmt.Sprintf("must not be negative, got %s (write auto to let rlpipe choose)", n.Value)))
		return 0, false
	}
	return AutoInt(v), true
}

// AutoBool is a boolean parameter that may also be written `auto`: rlpipe
// chooses the value when it plans the job, and the plan says what it chose
// and why. Its zero value is false.
type AutoBool int8

// BoolAuto is the AutoBool written `auto`.
const BoolAuto AutoBool = -1

// AutoBoolOf returns the AutoBool written as b.
func AutoBoolOf(b bool) AutoBool {
	if b {
		return 1
	}
	return 0
}

// IsAuto reports whether the parameter was written `auto` (or left to its
// auto default).
func (a AutoBool) IsAuto() bool { return a == BoolAuto }

// IsTrue reports whether the parameter was written true.
func (a AutoBool) IsTrue() bool { return a == 1 }

// String returns "auto", "true" or "false".
func (a AutoBool) String() string {
	switch {
	case a.IsAuto():
		return "auto"
	case a.IsTrue():
		return "true"
	}
	return "false"
}

// MarshalJSON writes "auto", true or false.
func (a AutoBool) MarshalJSON() ([]byte, error) {
	if a.IsAuto() {
		return []byte(`"auto"`), nil
	}
	return []byte(a.String()), nil
}

var autoBoolType = reflect.TypeFor[AutoBool]()

// autoBoolValue decodes `auto` or a boolean.
func (d *decoder) autoBoolValue(n *yaml.Node, path string) (AutoBool, bool) {
	n = resolve(n)
	if isAutoWord(n) {
		return BoolAuto, true
	}
	var v bool
	if n == nil || n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&v) != nil {
		d.errorf(n, "%s", label(path, "want true, false or auto, got "+describe(n)))
		return 0, false
	}
	return AutoBoolOf(v), true
}
