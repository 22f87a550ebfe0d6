package spec

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
)

// schemaOf generates the schema with kinds and decodes it.
func schemaOf(t *testing.T, kinds []SchemaKind) map[string]any {
	t.Helper()
	out, err := JSONSchema(kinds)
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return s
}

// dig follows keys from s through nested objects.
func dig(s map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		s, _ = s[k].(map[string]any)
	}
	return s
}

// propertyNames returns the sorted property names of schema s.
func propertyNames(s map[string]any) []string {
	var names []string
	for k := range dig(s, "properties") {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// TestSchemaKeys checks, for every mapping of the spec, that the keys the
// decoder accepts, as its message about an unknown key lists them, are the
// properties of the schema at that place.
func TestSchemaKeys(t *testing.T) {
	s := schemaOf(t, []SchemaKind{{Name: "k", Phase: Setup, Params: &struct{}{}}})
	step := `stages:
  step:
    - {id: a, uses: b, zzzzzzzz: 1}
`
	tests := []struct {
		name   string
		src    string
		schema map[string]any
	}{
		{"top", minimal + "zzzzzzzz: 1\n", s},
		{"model", strings.Replace(minimal, "    path: m\n", "    path: m\n    zzzzzzzz: 1\n", 1), dig(s, "definitions", "model")},
		{"mesh", minimal + "mesh:\n  zzzzzzzz: 1\n", dig(s, "properties", "mesh")},
		{"data", strings.Replace(minimal, "data:\n", "data:\n  zzzzzzzz: 1\n", 1), dig(s, "properties", "data")},
		{"train", strings.Replace(minimal, "train:\n", "train:\n  zzzzzzzz: 1\n", 1), dig(s, "properties", "train")},
		{"policies", minimal + "policies:\n  zzzzzzzz: 1\n", dig(s, "properties", "policies")},
		{"stages", minimal + "stages:\n  zzzzzzzz: 1\n", dig(s, "properties", "stages")},
		{"step stage", minimal + step, dig(s, "properties", "stages", "properties", "step", "items")},
		{"setup stage", minimal + strings.Replace(step, "step:", "setup:", 1), dig(s, "properties", "stages", "properties", "setup", "items")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("k.yaml", []byte(tt.src))
			_, known, ok := strings.Cut(fmt.Sprint(err), `unknown key "zzzzzzzz"`)
			_, known, ok2 := strings.Cut(known, "(known: ")
			known, _, ok3 := strings.Cut(known, ")")
			if !ok || !ok2 || !ok3 {
				t.Fatalf("no list of known keys in the errors:\n%v", err)
			}
			accepted := strings.Split(known, ", ")
			sort.Strings(accepted)
			if got := propertyNames(tt.schema); !slices.Equal(got, accepted) {
				t.Errorf("schema properties %v, decoder accepts %v", got, accepted)
			}
			if tt.schema["additionalProperties"] != false {
				t.Errorf("additionalProperties = %v, want false", tt.schema["additionalProperties"])
			}
		})
	}
}

// TestSchemaDefaults checks that the defaults the schema states for the
// mesh, data and train keys are the values the decoder gives a spec that
// leaves them out.
func TestSchemaDefaults(t *testing.T) {
	spec, err := Parse("d.yaml", []byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	s := schemaOf(t, nil)
	for _, section := range []struct {
		key    string
		values any
	}{{"mesh", spec.Mesh}, {"data", spec.Data}, {"train", spec.Train}} {
		v := reflect.ValueOf(section.values)
		for key, p := range dig(s, "properties", section.key, "properties") {
			def, ok := p.(map[string]any)["default"]
			if !ok {
				continue
			}
			norm := strings.ReplaceAll(key, "_", "")
			field := v.FieldByNameFunc(func(name string) bool { return strings.ToLower(name) == norm })
			if !field.IsValid() {
				t.Errorf("%s.%s: no field of %s holds it", section.key, key, v.Type())
				continue
			}
			if got, want := fmt.Sprint(field.Interface()), fmt.Sprint(def); got != want {
				t.Errorf("%s.%s: the decoder's default is %s, the schema's %s", section.key, key, got, want)
			}
		}
	}
}

// int64Bounds are the bounds of an int (on 64-bit platforms) or int64.
const int64Bounds = `"minimum":-9223372036854775808,"maximum":9223372036854775807`

// TestParamsSchema checks the schema of a `with:` block against the rules
// of DecodeStrict, on the struct TestDecodeStrict decodes into.
func TestParamsSchema(t *testing.T) {
	high := 0.28
	s, err := paramsSchema(&trainWith{EpsClip: 0.2, EpsClipHigh: &high, Steps: 3, Dims: []int{1, 2}, Tags: map[string]string{"a": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"eps_clip":      `{"type":"number","default":0.2}`,
		"eps_clip_high": `{"type":["number","null"],"default":0.28}`,
		"kl":            `{"type":"string"}`,
		"steps":         `{"type":"integer","default":3,"minimum":-2147483648,"maximum":2147483647}`,
		"chunk":         `{"type":"integer","default":0,"minimum":0,"maximum":65535}`,
		"entropy":       `{"type":"boolean","default":false}`,
		"model":         `{"type":"string"}`,
		"dims":          `{"type":["array","null"],"default":[1,2],"items":{"type":"integer",` + int64Bounds + `}}`,
		"pair":          `{"type":"array","items":{"type":"number","minimum":-3.4028234663852886e+38,"maximum":3.4028234663852886e+38},"minItems":2,"maxItems":2}`,
		"opt":           `{"type":["object","null"],"properties":{"beta1":{"type":"number"}},"additionalProperties":false}`,
		"tags":          `{"type":["object","null"],"default":{"a":"b"},"additionalProperties":{"type":"string"}}`,
		"raw":           `{}`,
		"any":           `{}`,
		"untagged":      `{"type":"integer","default":0,` + int64Bounds + `}`,
		"inline":        `{"type":"string"}`,
	}
	props := dig(got, "properties")
	for key, w := range want {
		p, err := json.Marshal(props[key])
		if err != nil {
			t.Fatal(err)
		}
		var wv any
		if err := json.Unmarshal([]byte(w), &wv); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if !reflect.DeepEqual(props[key], wv) {
			t.Errorf("%s: got %s\nwant %s", key, p, w)
		}
	}
	if len(props) != len(want) {
		t.Errorf("properties %v, want the %d keys of %v", propertyNames(got), len(want), reflect.ValueOf(want).MapKeys())
	}
	if !reflect.DeepEqual(got["required"], []any{"model"}) || !reflect.DeepEqual(got["type"], "object") || got["additionalProperties"] != false {
		t.Errorf("required %v, type %v, additionalProperties %v; want [model], object (a required key rules out null), false",
			got["required"], got["type"], got["additionalProperties"])
	}
	opt := dig(props, "opt", "properties", "beta1")
	if _, ok := opt["default"]; ok {
		t.Errorf("a nil pointer states a default: %v", opt)
	}
}

type recursive struct {
	Name     string      `yaml:"name"`
	Children []recursive `yaml:"children"`
}

// TestParamsSchemaTypes checks the parameters paramsSchema describes and
// those it refuses, as DecodeStrict would fail on them.
func TestParamsSchemaTypes(t *testing.T) {
	tests := []struct {
		name   string
		params any
		err    string // "" when the schema is generated
	}{
		{"auto", &struct {
			N AutoInt  `yaml:"n"`
			P *AutoInt `yaml:"p"`
			B AutoBool `yaml:"b"`
			F AutoBool `yaml:"f"`
		}{N: Auto, B: BoolAuto}, ""},
		{"recursive", &recursive{}, ""},
		{"doc tag", &struct {
			Dir string `yaml:"dir" doc:"Where the checkpoint goes."`
		}{}, ""},
		{"not a pointer", struct{}{}, "non-nil pointer to a struct"},
		{"nil", (*recursive)(nil), "non-nil pointer to a struct"},
		{"chan", &struct {
			C chan int `yaml:"c"`
		}{}, "with.c: cannot describe chan int"},
		{"int keys", &struct {
			M map[int]string `yaml:"m"`
		}{}, "with.m: cannot describe map[int]string"},
		{"interface", &struct {
			E error `yaml:"e"`
		}{}, "with.e: cannot describe error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := paramsSchema(tt.params)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("error %v, want %q", err, tt.err)
				}
				_, err := JSONSchema([]SchemaKind{{Name: "bad", Phase: Step, Params: tt.params}})
				if err == nil || !strings.HasPrefix(err.Error(), `stage kind "bad": `) {
					t.Errorf("JSONSchema: error %v, want one naming the kind", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			out, _ := json.Marshal(s)
			switch tt.name {
			case "auto":
				const n = `"n":{"description":"An integer, or auto: rlpipe chooses it when it plans the job.","default":"auto","anyOf":[{"type":"integer","minimum":0,"maximum":9223372036854775807},{"type":"string","enum":["auto"]}]}`
				const p = `"p":{"description":"An integer, or auto: rlpipe chooses it when it plans the job.","anyOf":[{"type":"integer","minimum":0,"maximum":9223372036854775807},{"type":"string","enum":["auto"]},{"type":"null"}]}`
				const b = `"b":{"description":"true, false, or auto: rlpipe chooses it when it plans the job.","default":"auto","anyOf":[{"type":"boolean"},{"type":"string","enum":["auto"]}]}`
				const f = `"f":{"description":"true, false, or auto: rlpipe chooses it when it plans the job.","default":false,"anyOf":[{"type":"boolean"},{"type":"string","enum":["auto"]}]}`
				for _, want := range []string{n, p, b, f} {
					if !strings.Contains(string(out), want) {
						t.Errorf("got %s\nwant %s", out, want)
					}
				}
			case "doc tag":
				if want := `"dir":{"description":"Where the checkpoint goes.","type":"string"}`; !strings.Contains(string(out), want) {
					t.Errorf("got %s\nwant %s", out, want)
				}
			case "recursive":
				const items = `"items":{"description":"A spec.recursive (recursive: not described further)."}`
				if !strings.Contains(string(out), items) {
					t.Errorf("got %s\nwant %s", out, items)
				}
			}
		})
	}
	if _, err := JSONSchema([]SchemaKind{{Name: "k", Phase: "later", Params: &struct{}{}}}); err == nil {
		t.Error("a kind of an unknown phase is accepted")
	}
}
