package cli

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
	"go.yaml.in/yaml/v3"
)

// schemaGolden is the schema as the docs ship it.
var schemaGolden = filepath.Join("..", "..", "..", "docs", "rlpipe.schema.json")

// TestSchemaGolden checks that rlpipe schema prints docs/rlpipe.schema.json
// (go test ./cmd/rlpipe/cli -run SchemaGolden -update rewrites it), and
// that the schema uses no keyword the validator below does not implement.
func TestSchemaGolden(t *testing.T) {
	code, out, stderr := runCLI(t, "schema")
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	name, err := filepath.Rel("testdata", schemaGolden) // golden's names are relative to testdata
	if err != nil {
		t.Fatal(err)
	}
	golden(t, name, out)
	for _, p := range unknownKeywords(loadSchema(t), "#") {
		t.Errorf("the validator does not implement %s", p)
	}
}

// loadSchema reads the golden schema.
func loadSchema(t *testing.T) map[string]any {
	t.Helper()
	var s map[string]any
	if err := json.Unmarshal(readAll(t, schemaGolden), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// The keywords validate implements: those that hold subschemas, those
// that hold values, and annotations it ignores.
var (
	schemaKeywords = map[string]string{
		"items": "schema", "additionalProperties": "schema", "propertyNames": "schema", "if": "schema", "then": "schema",
		"properties": "map", "patternProperties": "map", "definitions": "map",
		"allOf": "list", "anyOf": "list", "oneOf": "list",
	}
	valueKeywords = map[string]bool{
		"$ref": true, "type": true, "const": true, "enum": true, "pattern": true, "minLength": true,
		"minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true,
		"minItems": true, "maxItems": true, "required": true,
		"$schema": true, "title": true, "description": true, "default": true,
	}
)

// unknownKeywords returns the places in s of keywords validate does not
// implement.
func unknownKeywords(s any, at string) []string {
	m, ok := s.(map[string]any)
	if !ok {
		return nil
	}
	var bad []string
	for k, v := range m {
		p := at + "/" + k
		switch schemaKeywords[k] {
		case "schema":
			bad = append(bad, unknownKeywords(v, p)...)
		case "map":
			for name, sub := range v.(map[string]any) {
				bad = append(bad, unknownKeywords(sub, p+"/"+name)...)
			}
		case "list":
			for i, sub := range v.([]any) {
				bad = append(bad, unknownKeywords(sub, fmt.Sprintf("%s/%d", p, i))...)
			}
		default:
			if !valueKeywords[k] {
				bad = append(bad, p)
			}
		}
	}
	sort.Strings(bad)
	return bad
}

// validator checks values decoded from YAML (map[string]any, []any,
// string, int, float64, bool, nil) against a JSON Schema (draft-07) of
// the keywords JSONSchema emits. As in draft-07, a float with no fraction
// is an integer.
type validator struct {
	root map[string]any // for $ref
}

// validate returns the problems of x against schema s, each prefixed with
// the path of the value.
func (v validator) validate(s any, x any, at string) []string {
	if b, ok := s.(bool); ok {
		if b {
			return nil
		}
		return []string{at + ": not allowed"}
	}
	m := s.(map[string]any)
	if ref, ok := m["$ref"].(string); ok {
		name, _ := strings.CutPrefix(ref, "#/definitions/")
		return v.validate(v.root["definitions"].(map[string]any)[name], x, at)
	}
	var errs []string
	fail := func(format string, args ...any) { errs = append(errs, at+": "+fmt.Sprintf(format, args...)) }
	if t, ok := m["type"]; ok && !hasType(t, x) {
		fail("want %v, got %s %v", t, jsonType(x), x)
		return errs
	}
	if c, ok := m["const"]; ok && !sameJSON(c, x) {
		fail("want %v, got %v", c, x)
	}
	if e, ok := m["enum"]; ok && !slicesContainsJSON(e.([]any), x) {
		fail("want one of %v, got %v", e, x)
	}
	switch x := x.(type) {
	case string:
		if p, ok := m["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(x) {
			fail("%q does not match %s", x, p)
		}
		if n, ok := m["minLength"].(float64); ok && float64(len([]rune(x))) < n {
			fail("%q is shorter than %v", x, n)
		}
	case []any:
		if n, ok := m["minItems"].(float64); ok && float64(len(x)) < n {
			fail("fewer than %v items", n)
		}
		if n, ok := m["maxItems"].(float64); ok && float64(len(x)) > n {
			fail("more than %v items", n)
		}
		if items, ok := m["items"]; ok {
			for i, e := range x {
				errs = append(errs, v.validate(items, e, fmt.Sprintf("%s[%d]", at, i))...)
			}
		}
	case map[string]any:
		errs = append(errs, v.object(m, x, at)...)
	default:
		if f, ok := number(x); ok {
			errs = append(errs, bounds(m, f, at)...)
		}
	}
	for _, sub := range list(m["allOf"]) {
		errs = append(errs, v.validate(sub, x, at)...)
	}
	if anyOf := list(m["anyOf"]); anyOf != nil && v.matches(anyOf, x) == 0 {
		fail("matches none of anyOf")
	}
	if oneOf := list(m["oneOf"]); oneOf != nil && v.matches(oneOf, x) != 1 {
		fail("matches %d of oneOf, want 1", v.matches(oneOf, x))
	}
	if cond, ok := m["if"]; ok && len(v.validate(cond, x, at)) == 0 {
		if then, ok := m["then"]; ok {
			errs = append(errs, v.validate(then, x, at)...)
		}
	}
	return errs
}

// object checks the keys of the mapping x against m.
func (v validator) object(m map[string]any, x map[string]any, at string) []string {
	var errs []string
	for _, r := range list(m["required"]) {
		if _, ok := x[r.(string)]; !ok {
			errs = append(errs, fmt.Sprintf("%s: missing %s", at, r))
		}
	}
	props, _ := m["properties"].(map[string]any)
	patterns, _ := m["patternProperties"].(map[string]any)
	keys := make([]string, 0, len(x))
	for k := range x {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p := at + "." + k
		if names, ok := m["propertyNames"]; ok {
			errs = append(errs, v.validate(names, k, p+" (key)")...)
		}
		matched := false
		if s, ok := props[k]; ok {
			matched = true
			errs = append(errs, v.validate(s, x[k], p)...)
		}
		for re, s := range patterns {
			if regexp.MustCompile(re).MatchString(k) {
				matched = true
				errs = append(errs, v.validate(s, x[k], p)...)
			}
		}
		if add, ok := m["additionalProperties"]; ok && !matched {
			if add == false {
				errs = append(errs, p+": unknown key")
			} else {
				errs = append(errs, v.validate(add, x[k], p)...)
			}
		}
	}
	return errs
}

// matches counts the schemas of list that x is valid against.
func (v validator) matches(list []any, x any) int {
	n := 0
	for _, s := range list {
		if len(v.validate(s, x, "")) == 0 {
			n++
		}
	}
	return n
}

// bounds checks the number f against the bounds of m.
func bounds(m map[string]any, f float64, at string) []string {
	var errs []string
	for _, b := range []struct {
		key string
		ok  func(f, b float64) bool
	}{
		{"minimum", func(f, b float64) bool { return f >= b }},
		{"maximum", func(f, b float64) bool { return f <= b }},
		{"exclusiveMinimum", func(f, b float64) bool { return f > b }},
		{"exclusiveMaximum", func(f, b float64) bool { return f < b }},
	} {
		if lim, ok := m[b.key].(float64); ok && !b.ok(f, lim) {
			errs = append(errs, fmt.Sprintf("%s: %v fails %s %v", at, f, b.key, lim))
		}
	}
	return errs
}

// dig follows keys from x through nested objects; nil where one is missing.
func dig(x any, keys ...string) map[string]any {
	m, _ := x.(map[string]any)
	for _, k := range keys {
		m, _ = m[k].(map[string]any)
	}
	return m
}

func list(x any) []any {
	l, _ := x.([]any)
	return l
}

// number returns x as a float64 when it is a number.
func number(x any) (float64, bool) {
	switch x := x.(type) {
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// jsonType is the JSON Schema type of x.
func jsonType(x any) string {
	switch x.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	if f, ok := number(x); ok && f == math.Trunc(f) && !math.IsInf(f, 0) {
		return "integer"
	}
	return "number"
}

// hasType reports whether x is of the type, or one of the types, t.
func hasType(t any, x any) bool {
	types := []any{t}
	if l, ok := t.([]any); ok {
		types = l
	}
	for _, want := range types {
		if got := jsonType(x); got == want || want == "number" && got == "integer" {
			return true
		}
	}
	return false
}

// sameJSON reports whether a and b are equal as JSON values.
func sameJSON(a, b any) bool {
	fa, okA := number(a)
	fb, okB := number(b)
	if okA || okB {
		return okA && okB && fa == fb
	}
	return reflect.DeepEqual(a, b)
}

func slicesContainsJSON(l []any, x any) bool {
	for _, e := range l {
		if sameJSON(e, x) {
			return true
		}
	}
	return false
}

// yamlValue decodes YAML text the way the language server reads it.
func yamlValue(t *testing.T, src []byte) any {
	t.Helper()
	var x any
	if err := yaml.Unmarshal(src, &x); err != nil {
		t.Fatal(err)
	}
	return x
}

// TestSchemaValidSpecs validates every example and every valid spec of
// the tests against the schema.
func TestSchemaValidSpecs(t *testing.T) {
	s := loadSchema(t)
	v := validator{root: s}
	var files []string
	for _, pattern := range []string{"examples/*.yaml", "spec/testdata/valid/*.yaml", "stages/testdata/*.yaml"} {
		matches, err := filepath.Glob(filepath.Join("..", "..", "..", pattern))
		if err != nil || len(matches) == 0 {
			t.Fatalf("%s: no specs (%v)", pattern, err)
		}
		files = append(files, matches...)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := spec.Parse(f, data); err != nil {
				t.Fatalf("not a valid spec: %v", err)
			}
			for _, e := range v.validate(s, yamlValue(t, data), "") {
				t.Error(e)
			}
		})
	}
}

// schemaBase is a valid spec with stages of both phases; the cases of
// TestSchemaAgreesWithDecoder edit it.
const schemaBase = `version: 1
name: t
models:
  actor:
    path: m
  ref:
    copy_of: actor
mesh:
  gpus_per_node: 1
  gpu: h100-80g
data:
  rollouts: r.jsonl
  global_batch_size: 8
  max_tokens_per_gpu: 1024
train:
  steps: 10
  decay: cosine
  betas: [0.9, 0.95]
policies:
  recompute: auto
stages:
  setup:
    - {id: load, uses: load_hf, with: {model: actor}}
    - {id: shard, uses: apply_fsdp2, needs: load, with: {model: actor}}
  step:
    - {id: pack, uses: pack}
    - id: train
      uses: train
      with: {chunk_tokens: auto, eps_clip: 0.2}
`

// decoderAccepts reports whether spec.Parse and the stage kinds' decoding
// accept src, and what they report.
func decoderAccepts(src string) (bool, string) {
	s, err := spec.Parse("s.yaml", []byte(src))
	errs := fmt.Sprint(err)
	if s == nil {
		return false, errs
	}
	for _, st := range append(append([]*spec.Stage(nil), s.Setup...), s.Step...) {
		if _, es := stages.Decode(st); len(es) > 0 {
			err, errs = es, errs+"\n"+es.Error()
		}
	}
	return err == nil, errs
}

// TestSchemaAgreesWithDecoder edits a valid spec and checks that the
// schema and the decoder agree on whether it is valid, except for what
// the schema cannot express (gap), which only the decoder rejects.
func TestSchemaAgreesWithDecoder(t *testing.T) {
	s := loadSchema(t)
	v := validator{root: s}
	tests := []struct {
		name     string
		old, new string // replaced once in schemaBase; old "" appends new
		valid    bool
		gap      bool // the decoder rejects it, the schema cannot tell
	}{
		{"base", "", "", true, false},
		{"unknown top-level key", "", "extra: 1\n", false, false},
		{"unknown mesh key", "gpus_per_node: 1", "gpus_per_nod: 1", false, false},
		{"unknown model key", "path: m", "path: m\n    dtype: bf16", false, false},
		{"int as string", "gpus_per_node: 1", `gpus_per_node: "1"`, false, false},
		{"float for int", "global_batch_size: 8", "global_batch_size: 8.5", false, false},
		{"int above bound", "gpus_per_node: 1", "gpus_per_node: 65", false, false},
		{"int below bound", "steps: 10", "steps: 0", false, false},
		{"bad enum", "decay: cosine", "decay: cosin", false, false},
		{"bad role", "copy_of: actor", "copy_of: actor\n    role: critic", false, false},
		{"model without role", "  ref:\n", "  critic:\n", false, false},
		{"path and copy_of", "copy_of: actor", "copy_of: actor\n    path: m", false, false},
		{"neither path nor copy_of", "copy_of: actor", "role: ref", false, false},
		{"bad model name", "  ref:\n", "  .ref:\n", false, false},
		{"bad name", "name: t", "name: -t", false, false},
		{"version 2", "version: 1", "version: 2", false, false},
		{"missing required section", "train:\n  steps: 10\n  decay: cosine\n  betas: [0.9, 0.95]\n", "", false, false},
		{"missing required key", "  max_tokens_per_gpu: 1024\n", "", false, false},
		{"null section", "mesh:\n  gpus_per_node: 1\n  gpu: h100-80g\n", "mesh:\n", true, false},
		{"temperature 0", "rollouts: r.jsonl", "rollouts: r.jsonl\n  temperature: 0", false, false},
		{"beta of 1", "[0.9, 0.95]", "[0.9, 1.0]", false, false},
		{"one beta", "[0.9, 0.95]", "[0.9]", false, false},
		{"bool for bool", "steps: 10", "steps: 10\n  shuffle: true", true, false},
		{"string for bool", "steps: 10", "steps: 10\n  shuffle: yes", false, false},
		{"gpu bytes", "gpu: h100-80g", "gpu: 85017493504", true, false},
		{"gpu 0", "gpu: h100-80g", "gpu: 0", false, false},
		{"host memory", "gpu: h100-80g", "gpu: h100-80g\n  host_memory: 2TiB", true, false},
		{"bool expression", "recompute: auto", "recompute: auto\n  offload: true", true, false},
		{"number for string expression", "recompute: auto", "recompute: auto\n  precision: 1", false, false},
		{"expression list", "recompute: auto", "recompute: [layer]", false, false},
		{"needs list", "needs: load", "needs: [load]", true, false},
		{"empty needs", "needs: load", `needs: ""`, false, false},
		{"bad stage id", "id: pack", "id: Pack", false, false},
		{"missing uses", "{id: pack, uses: pack}", "{id: pack}", false, false},
		{"unknown stage kind", "uses: pack}", "uses: packk}", false, false},
		{"kind of the other phase", "uses: pack}", "uses: load_hf}", false, false},
		{"unknown stage key", "{id: pack, uses: pack}", "{id: pack, uses: pack, after: load}", false, false},
		{"unknown with key", "eps_clip: 0.2", "eps_clipp: 0.2", false, false},
		{"with wrong type", "eps_clip: 0.2", `eps_clip: "x"`, false, false},
		{"with auto int", "chunk_tokens: auto", "chunk_tokens: 256", true, false},
		{"with bad auto", "chunk_tokens: auto", "chunk_tokens: autoo", false, false},
		{"with negative auto int", "chunk_tokens: auto", "chunk_tokens: -1", false, false},
		{"with null", "{id: pack, uses: pack}", "{id: pack, uses: pack, with: null}", true, false},
		{"with list", "{id: pack, uses: pack}", "{id: pack, uses: pack, with: [1]}", false, false},
		{"nested with key", "{id: pack, uses: pack}", "{id: gen, uses: generate, with: {engine: sglang, reward: {exprr: '1'}}}", false, false},
		{"when", "{id: pack, uses: pack}", "{id: pack, uses: pack, when: step % 2 == 0}", true, false},
		{"null when", "{id: pack, uses: pack}", "{id: pack, uses: pack, when: null}", false, false},
		{"dp against the world", "gpus_per_node: 1", "gpus_per_node: 1\n  dp: 2", false, true},
		{"two actors", "copy_of: actor", "copy_of: actor\n    role: actor", false, true},
		{"unknown name in an expression", "recompute: auto", "recompute: lyr.index < 4", false, true},
		{"integral float for int", "global_batch_size: 8", "global_batch_size: 8.0", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := schemaBase + tt.new
			if tt.old != "" || tt.new == "" {
				if !strings.Contains(schemaBase, tt.old) {
					t.Fatalf("%q is not in the base spec", tt.old)
				}
				src = strings.Replace(schemaBase, tt.old, tt.new, 1)
			}
			ok, report := decoderAccepts(src)
			if ok != tt.valid {
				t.Errorf("decoder accepts: %v, want %v:\n%s", ok, tt.valid, report)
			}
			errs := v.validate(s, yamlValue(t, []byte(src)), "")
			if schemaOK := len(errs) == 0; schemaOK != (tt.valid || tt.gap) {
				t.Errorf("schema accepts: %v, want %v: %v", schemaOK, tt.valid || tt.gap, errs)
			}
		})
	}
}

// schemaSamples are the values TestSchemaWithFollowsDecodeStrict tries
// under each key of a `with:` block.
var schemaSamples = []string{
	"0", "1", "-1", "300", "70000", "0.5", "1e40", `"x"`, `""`, "auto", "true", "null",
	"[]", "[1]", `["x"]`, "[1, 2]", "{}", "{a: 1}", `{a: "x"}`, "{beta1: 0.5}",
}

// schemaProbe has a field of every type DecodeStrict decodes.
type schemaProbe struct {
	Name       string                   `yaml:"name,required"`
	Small      int8                     `yaml:"small"`
	Count      uint16                   `yaml:"count"`
	Big        uint64                   `yaml:"big"`
	Ratio      float32                  `yaml:"ratio"`
	Flag       *bool                    `yaml:"flag"`
	Chunk      spec.AutoInt             `yaml:"chunk"`
	IDs        []int                    `yaml:"ids"`
	Pair       [2]float64               `yaml:"pair"`
	Labels     map[string]string        `yaml:"labels"`
	Nested     *struct{ Beta1 float64 } `yaml:"nested"`
	Free       any                      `yaml:"free"`
	Node       yaml.Node                `yaml:"node"`
	Ignored    string                   `yaml:"-"`
	probeEmbed `yaml:",inline"`
}

// probeEmbed is inlined into schemaProbe.
type probeEmbed struct {
	Mode string `yaml:"mode"`
}

// TestSchemaWithFollowsDecodeStrict tries every sample under every key of
// every registered kind's `with:` block, and of a probe struct with every
// type DecodeStrict decodes, and checks that the schema accepts exactly
// what DecodeStrict does.
func TestSchemaWithFollowsDecodeStrict(t *testing.T) {
	kinds := append(schemaKinds(), spec.SchemaKind{Name: "probe", Phase: spec.Step, Params: &schemaProbe{}})
	out, err := spec.JSONSchema(kinds)
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatal(err)
	}
	v := validator{root: s}
	withs := map[string]map[string]any{}
	for _, phase := range []string{"setup", "step"} {
		for _, c := range list(dig(s, "properties", "stages", "properties", phase, "items")["allOf"]) {
			name, _ := dig(c, "if", "properties", "uses")["const"].(string)
			withs[name] = dig(c, "then", "properties", "with")
		}
	}
	for _, k := range kinds {
		with := withs[k.Name]
		if with == nil {
			t.Errorf("no with: schema for kind %q", k.Name)
			continue
		}
		base := "" // the probe's required key, beside the key tried
		if k.Name == "probe" {
			base = "name: n\n"
		}
		keys := []string{"zzzzzzzz"}
		for key := range dig(with, "properties") {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		for _, key := range keys {
			for _, sample := range schemaSamples {
				src := base + key + ": " + sample + "\n"
				if key == "name" {
					src = src[len(base):]
				}
				var n yaml.Node
				if err := yaml.Unmarshal([]byte(src), &n); err != nil {
					t.Fatal(err)
				}
				params := reflect.New(reflect.TypeOf(k.Params).Elem()).Interface()
				decodeErrs := spec.DecodeStrict("w.yaml", &n, params)
				schemaErrs := v.validate(with, yamlValue(t, []byte(src)), "with")
				if (len(decodeErrs) == 0) != (len(schemaErrs) == 0) {
					t.Errorf("%s: with: {%s}: DecodeStrict reports %v; the schema %v", k.Name, strings.TrimSpace(strings.ReplaceAll(src, "\n", ", ")), decodeErrs, schemaErrs)
				}
			}
		}
	}
	probe := dig(withs["probe"], "properties")
	if probe["mode"] == nil || dig(probe, "nested", "properties")["beta1"] == nil || probe["ignored"] != nil {
		t.Errorf("the probe's schema lacks the inline key mode or the nested beta1, or has the ignored key: %v", probe)
	}
}
