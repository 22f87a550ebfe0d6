package spec

import (
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// decoder walks a yaml.Node tree and collects every error it finds.
type decoder struct {
	file  string
	errs  Errors
	facts facts // for sanitize
}

// facts is what sanitize needs to know of a decoded spec beyond its values.
type facts struct {
	defaultRollout bool            // data.rollout_batch_size is absent: it holds its default
	defaultDecay   bool            // train.decay_steps is absent or 0: it holds its default
	failed         map[string]bool // the keys, by path, a cross-field check reported
}

// fail records that a cross-field check reported the key at path, so that
// sanitize resets it even if the value it was checked against changes.
func (d *decoder) fail(path string) {
	if d.facts.failed == nil {
		d.facts.failed = map[string]bool{}
	}
	d.facts.failed[path] = true
}

// pos returns the position of n in the decoder's file.
func (d *decoder) pos(n *yaml.Node) Pos { return NodePos(d.file, n) }

// errorf records an error at the position of n.
func (d *decoder) errorf(n *yaml.Node, format string, args ...any) {
	d.errs = append(d.errs, Errorf(d.pos(n), format, args...))
}

// label prefixes msg with the path of the value it is about.
func label(path, msg string) string {
	if path == "" {
		return msg
	}
	return path + ": " + msg
}

// where names the mapping at path for messages about its keys.
func where(path string) string {
	if path == "" {
		return "at top level"
	}
	return "in " + path
}

// join appends key to path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// resolve follows aliases to the node they refer to.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && n.Alias != nil && i < 64; i++ {
		n = n.Alias
	}
	return n
}

// isNull reports whether n is absent or an explicit YAML null.
func isNull(n *yaml.Node) bool {
	n = resolve(n)
	return n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names the kind and value of n for "want X, got Y" messages.
func describe(n *yaml.Node) string {
	n = resolve(n)
	if n == nil {
		return "nothing"
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.DocumentNode:
		return "a document"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
	default:
		return "an unknown node"
	}
	v := n.Value
	if r := []rune(v); len(r) > 40 {
		v = string(r[:37]) + "..."
	}
	switch tag := n.ShortTag(); tag {
	case "!!str":
		return "string " + strconv.Quote(v)
	case "!!int":
		return "integer " + v
	case "!!float":
		return "float " + v
	case "!!bool":
		return "bool " + v
	case "!!null":
		return "null"
	default:
		return fmt.Sprintf("%s %s", strings.TrimPrefix(tag, "!!"), strconv.Quote(v))
	}
}

// field is one key/value pair of a mapping.
type field struct {
	key, val *yaml.Node
}

// fields holds the pairs of a mapping by key, in file order.
type fields struct {
	node  *yaml.Node // the mapping; nil when it was absent or null
	at    *yaml.Node // where to report missing keys
	path  string
	m     map[string]field
	order []string
	bad   bool     // the node was not a mapping; missing keys are not reported
	defs  []keyDef // the definitions of the keys, for a mapping of the spec
}

// def returns the definition of key, a key of a mapping of the spec.
func (f *fields) def(key string) *keyDef { return lookupKey(f.defs, key) }

// get returns the resolved value of key, or nil when key is absent.
func (f *fields) get(key string) *yaml.Node {
	if fv, ok := f.m[key]; ok {
		return resolve(fv.val)
	}
	return nil
}

// has reports whether key is present with a non-null value.
func (f *fields) has(key string) bool { return !isNull(f.get(key)) }

// keyNode returns the key node of key, or nil.
func (f *fields) keyNode(key string) *yaml.Node { return f.m[key].key }

// mapping checks that n is a mapping (or null, which reads as empty) and
// returns its pairs. It reports keys that are not strings, duplicate keys and,
// when known is not nil, unknown keys. at is the node missing keys are
// reported at: the key that introduces the mapping, or the mapping itself.
func (d *decoder) mapping(n, at *yaml.Node, path string, known []string) *fields {
	n = resolve(n)
	if at == nil {
		at = n
	}
	f := &fields{at: at, path: path, m: map[string]field{}}
	if isNull(n) {
		return f
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "%s", label(path, "want a mapping, got "+describe(n)))
		f.bad = true
		return f
	}
	f.node = n
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), n.Content[i+1]
		if k == nil || k.Kind != yaml.ScalarNode {
			d.errorf(n.Content[i], "%s", label(path, "keys must be strings, got "+describe(k)))
			continue
		}
		if k.ShortTag() == "!!merge" {
			d.errorf(k, "%s", label(path, "merge keys (<<) are not supported"))
			continue
		}
		key := k.Value
		if prev, dup := f.m[key]; dup {
			d.errorf(k, "duplicate key %q %s (first at line %d)", key, where(path), prev.key.Line)
			continue
		}
		if known != nil && !contains(known, key) {
			d.errorf(k, "unknown key %q %s %s", key, where(path), suggest(key, known))
			continue
		}
		f.m[key] = field{key: k, val: v}
		f.order = append(f.order, key)
	}
	return f
}

// require reports every key of keys that is absent or null.
func (d *decoder) require(f *fields, keys ...string) {
	if f.bad {
		return
	}
	for _, k := range keys {
		if !f.has(k) {
			d.errorf(f.at, "%s", label(f.path, fmt.Sprintf("missing required key %q", k)))
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// suggest returns "(did you mean "x"?)" for the known key closest to key, or
// the list of known keys when none is close.
func suggest(key string, known []string) string {
	if best := Closest(key, known); best != "" {
		return fmt.Sprintf("(did you mean %q?)", best)
	}
	if len(known) == 0 {
		return "(no keys are allowed here)"
	}
	return "(known: " + strings.Join(known, ", ") + ")"
}

// Closest returns the candidate a misspelt name most likely meant: the
// nearest by edit distance (case-insensitive, '-' as '_') when within 1, 2
// or 3 edits for names of up to 4, 8 or more runes, else a candidate the
// name abbreviates (its runes in order, for names of 3 runes or more), else "".
func Closest(name string, candidates []string) string {
	norm := func(s string) string { return strings.ReplaceAll(strings.ToLower(s), "-", "_") }
	best, bestD := "", math.MaxInt
	for _, k := range candidates {
		if dist := editDistance(norm(name), norm(k)); dist < bestD {
			best, bestD = k, dist
		}
	}
	limit := 1
	switch n := len([]rune(name)); {
	case n > 8:
		limit = 3
	case n > 4:
		limit = 2
	}
	if best != "" && bestD <= limit {
		return best
	}
	if len(name) >= 3 {
		for _, k := range candidates {
			if isSubsequence(norm(name), norm(k)) {
				return k
			}
		}
	}
	return ""
}

// isSubsequence reports whether the runes of a appear in b in order, as in
// an abbreviation ("lyr" of "layer").
func isSubsequence(a, b string) bool {
	rb := []rune(b)
	j := 0
	for _, r := range a {
		for j < len(rb) && rb[j] != r {
			j++
		}
		if j == len(rb) {
			return false
		}
		j++
	}
	return true
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and transpositions of adjacent runes.
func editDistance(a, b string) int {
	s, t := []rune(a), []rune(b)
	if len(s) > 64 || len(t) > 64 {
		if a == b {
			return 0
		}
		return math.MaxInt
	}
	d := make([][]int, len(s)+1)
	for i := range d {
		d[i] = make([]int, len(t)+1)
		d[i][0] = i
	}
	for j := range t {
		d[0][j+1] = j + 1
	}
	for i := 1; i <= len(s); i++ {
		for j := 1; j <= len(t); j++ {
			cost := 1
			if s[i-1] == t[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && s[i-1] == t[j-2] && s[i-2] == t[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(s)][len(t)]
}

// bigIntRE matches integers too large for YAML to tag them !!int.
var bigIntRE = regexp.MustCompile(`^[-+]?[0-9][0-9_]*$`)

// intValue decodes an integer scalar that fits in bits bits.
func (d *decoder) intValue(n *yaml.Node, path string, bits int) (int64, bool) {
	n = resolve(n)
	if n != nil && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" && bigIntRE.MatchString(n.Value) {
		d.errorf(n, "%s", label(path, fmt.Sprintf("integer %s out of range", n.Value)))
		return 0, false
	}
	if n == nil || n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.errorf(n, "%s", label(path, "want an integer, got "+describe(n)))
		return 0, false
	}
	var v int64
	if err := n.Decode(&v); err != nil || bits < 64 && (v < -1<<(bits-1) || v > 1<<(bits-1)-1) {
		d.errorf(n, "%s", label(path, fmt.Sprintf("integer %s out of range", n.Value)))
		return 0, false
	}
	return v, true
}

// uintValue decodes a non-negative integer scalar that fits in bits bits.
func (d *decoder) uintValue(n *yaml.Node, path string, bits int) (uint64, bool) {
	n = resolve(n)
	if n == nil || n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.errorf(n, "%s", label(path, "want a non-negative integer, got "+describe(n)))
		return 0, false
	}
	if strings.HasPrefix(n.Value, "-") {
		d.errorf(n, "%s", label(path, fmt.Sprintf("must not be negative, got %s", n.Value)))
		return 0, false
	}
	var v uint64
	if err := n.Decode(&v); err != nil || bits < 64 && v > 1<<bits-1 {
		d.errorf(n, "%s", label(path, fmt.Sprintf("integer %s out of range", n.Value)))
		return 0, false
	}
	return v, true
}

// floatValue decodes a finite number; integers are accepted.
func (d *decoder) floatValue(n *yaml.Node, path string) (float64, bool) {
	n = resolve(n)
	if n == nil || n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" && n.ShortTag() != "!!float" {
		d.errorf(n, "%s", label(path, "want a number, got "+describe(n)))
		return 0, false
	}
	var v float64
	if err := n.Decode(&v); err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		d.errorf(n, "%s", label(path, "want a finite number, got "+describe(n)))
		return 0, false
	}
	return v, true
}

// boolValue decodes true or false.
func (d *decoder) boolValue(n *yaml.Node, path string) (bool, bool) {
	n = resolve(n)
	if n == nil || n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		d.errorf(n, "%s", label(path, "want a boolean (true or false), got "+describe(n)))
		return false, false
	}
	var v bool
	if err := n.Decode(&v); err != nil {
		d.errorf(n, "%s", label(path, "want a boolean (true or false), got "+describe(n)))
		return false, false
	}
	return v, true
}

// stringValue decodes a string scalar.
func (d *decoder) stringValue(n *yaml.Node, path string) (string, bool) {
	n = resolve(n)
	if n == nil || n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		d.errorf(n, "%s", label(path, "want a string, got "+describe(n)))
		return "", false
	}
	return n.Value, true
}

// DecodeStrict decodes the mapping n of file into the struct out points to,
// the way a stage decodes its `with:` block. Keys are the `yaml:"name"` tags
// of the fields (the lower-cased field name when untagged; "-" skips a field;
// the option ",inline" flattens an embedded struct; the option ",required"
// makes a key mandatory). Nested structs, pointers, slices, arrays, maps with
// string keys, integers, floats, bools, strings, `any`, yaml.Node and
// *yaml.Node fields are supported. Fields whose keys are absent keep the
// values out already holds, so callers set defaults before decoding. A nil or
// null n decodes nothing; only its missing required keys are reported.
//
// Every unknown key, duplicate key, wrong type and missing required key is
// reported with its position; messages name values by their path below
// "with", e.g. `with.eps_clip: want a number, got string "x"`.
func DecodeStrict(file string, n *yaml.Node, out any) Errors {
	return DecodeStrictIn(file, n, out, "with")
}

// DecodeStrictIn is DecodeStrict with path naming n in messages
// (e.g. "with", "stages.step.train.with"); an empty path names nothing.
func DecodeStrictIn(file string, n *yaml.Node, out any, path string) Errors {
	rv := reflect.ValueOf(out)
	if !rv.IsValid() || rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return Errors{Errorf(NodePos(file, n), "internal error: DecodeStrict needs a non-nil pointer to a struct, got %T", out)}
	}
	if n != nil && n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		n = n.Content[0]
	}
	d := &decoder{file: file}
	d.value(n, nil, rv.Elem(), path, 0)
	if len(d.errs) == 0 {
		return nil
	}
	d.errs.Sort()
	return d.errs
}

var nodeType = reflect.TypeFor[yaml.Node]()

// maxDepth bounds the nesting DecodeStrict follows, for recursive types.
const maxDepth = 100

// value decodes n into v. at is where a missing key of a mapping at n is
// reported.
func (d *decoder) value(n, at *yaml.Node, v reflect.Value, path string, depth int) {
	n = resolve(n)
	if depth > maxDepth {
		d.errorf(n, "%s", label(path, "nested too deeply"))
		return
	}
	switch v.Type() {
	case nodeType:
		if n != nil {
			v.Set(reflect.ValueOf(*n))
		}
		return
	case reflect.PointerTo(nodeType):
		v.Set(reflect.ValueOf(n))
		return
	case autoIntType:
		if a, ok := d.autoIntValue(n, path); ok {
			v.Set(reflect.ValueOf(a))
		}
		return
	case autoBoolType:
		if a, ok := d.autoBoolValue(n, path); ok {
			v.Set(reflect.ValueOf(a))
		}
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if isNull(n) {
			v.SetZero()
			return
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.value(n, at, v.Elem(), path, depth+1)
	case reflect.Struct:
		d.structValue(n, at, v, path, depth)
	case reflect.Slice:
		if isNull(n) {
			v.SetZero()
			return
		}
		if n.Kind != yaml.SequenceNode {
			d.errorf(n, "%s", label(path, "want a list, got "+describe(n)))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, c := range n.Content {
			d.value(c, c, s.Index(i), fmt.Sprintf("%s[%d]", path, i), depth+1)
		}
		v.Set(s)
	case reflect.Array:
		if n == nil || n.Kind != yaml.SequenceNode || len(n.Content) != v.Len() {
			got := describe(n)
			if n != nil && n.Kind == yaml.SequenceNode {
				got = fmt.Sprintf("a list of %d", len(n.Content))
			}
			d.errorf(n, "%s", label(path, fmt.Sprintf("want a list of %d, got %s", v.Len(), got)))
			return
		}
		for i, c := range n.Content {
			d.value(c, c, v.Index(i), fmt.Sprintf("%s[%d]", path, i), depth+1)
		}
	case reflect.Map:
		d.mapValue(n, v, path, depth)
	case reflect.Interface:
		if v.NumMethod() != 0 {
			d.errorf(n, "%s", label(path, fmt.Sprintf("internal error: cannot decode into %s", v.Type())))
			return
		}
		var x any
		if err := n.Decode(&x); err != nil {
			d.errorf(n, "%s", label(path, strings.TrimPrefix(err.Error(), "yaml: ")))
			return
		}
		if x == nil {
			v.SetZero()
		} else {
			v.Set(reflect.ValueOf(x))
		}
	case reflect.Bool:
		if b, ok := d.boolValue(n, path); ok {
			v.SetBool(b)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if i, ok := d.intValue(n, path, v.Type().Bits()); ok {
			v.SetInt(i)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if u, ok := d.uintValue(n, path, v.Type().Bits()); ok {
			v.SetUint(u)
		}
	case reflect.Float32, reflect.Float64:
		if f, ok := d.floatValue(n, path); ok {
			if v.Kind() == reflect.Float32 && math.Abs(f) > math.MaxFloat32 {
				d.errorf(n, "%s", label(path, fmt.Sprintf("number %s out of range", n.Value)))
				return
			}
			v.SetFloat(f)
		}
	case reflect.String:
		if s, ok := d.stringValue(n, path); ok {
			v.SetString(s)
		}
	default:
		d.errorf(n, "%s", label(path, fmt.Sprintf("internal error: cannot decode into %s", v.Type())))
	}
}

// mapValue decodes a mapping into a map with string keys.
func (d *decoder) mapValue(n *yaml.Node, v reflect.Value, path string, depth int) {
	t := v.Type()
	if t.Key().Kind() != reflect.String {
		d.errorf(n, "%s", label(path, fmt.Sprintf("internal error: cannot decode into %s", t)))
		return
	}
	if isNull(n) {
		v.SetZero()
		return
	}
	f := d.mapping(n, nil, path, nil)
	if f.bad {
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMapWithSize(t, len(f.order)))
	}
	for _, key := range f.order {
		kv := reflect.ValueOf(key).Convert(t.Key())
		elem := reflect.New(t.Elem()).Elem()
		if old := v.MapIndex(kv); old.IsValid() {
			elem.Set(old)
		}
		fv := f.m[key]
		d.value(fv.val, fv.key, elem, join(path, key), depth+1)
		v.SetMapIndex(kv, elem)
	}
}

// structField is one decodable field of a struct type.
type structField struct {
	name     string
	index    []int
	required bool
}

// structFields lists the decodable fields of t, flattening ",inline" ones.
func structFields(t reflect.Type, prefix []int, out []structField) []structField {
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		tag := sf.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		index := append(append([]int(nil), prefix...), i)
		inline, required := false, false
		for _, o := range strings.Split(opts, ",") {
			switch o {
			case "inline":
				inline = true
			case "required":
				required = true
			}
		}
		if inline && sf.Type.Kind() == reflect.Struct {
			out = structFields(sf.Type, index, out)
			continue
		}
		if !sf.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(sf.Name)
		}
		out = append(out, structField{name: name, index: index, required: required})
	}
	return out
}

// structValue decodes a mapping into a struct.
func (d *decoder) structValue(n, at *yaml.Node, v reflect.Value, path string, depth int) {
	sfs := structFields(v.Type(), nil, nil)
	known := make([]string, len(sfs))
	for i, sf := range sfs {
		known[i] = sf.name
	}
	f := d.mapping(n, at, path, known)
	for _, sf := range sfs {
		fv, ok := f.m[sf.name]
		if !ok {
			if sf.required {
				d.require(f, sf.name)
			}
			continue
		}
		d.value(fv.val, fv.key, v.FieldByIndex(sf.index), join(path, sf.name), depth+1)
	}
}
