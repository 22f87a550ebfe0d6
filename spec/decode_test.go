package spec

import (
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

type trainWith struct {
	EpsClip     float64           `yaml:"eps_clip"`
	EpsClipHigh *float64          `yaml:"eps_clip_high"`
	KL          string            `yaml:"kl"`
	Steps       int32             `yaml:"steps"`
	Chunk       uint16            `yaml:"chunk"`
	Entropy     bool              `yaml:"entropy"`
	Model       string            `yaml:"model,required"`
	Dims        []int             `yaml:"dims"`
	Pair        [2]float32        `yaml:"pair"`
	Opt         *optWith          `yaml:"opt"`
	Tags        map[string]string `yaml:"tags"`
	Raw         *yaml.Node        `yaml:"raw"`
	Any         any               `yaml:"any"`
	Skip        int               `yaml:"-"`
	Untagged    int
	inner       `yaml:",inline"`
}

type inner struct {
	Inline string `yaml:"inline"`
}

type optWith struct {
	Beta1 float64 `yaml:"beta1"`
}

// node parses src and returns its root mapping.
func node(t *testing.T, file, src string) *yaml.Node {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	RegisterSource(file, []byte(src))
	return &doc
}

func TestDecodeStrict(t *testing.T) {
	ok := `model: actor
eps_clip: 1
eps_clip_high: 0.28
kl: k3
steps: 7
chunk: 65535
entropy: true
dims: [1, 2]
pair: [0.5, 1]
opt: {beta1: 0.9}
tags: {a: b}
raw: [x, {y: 1}]
any: {k: [1, two]}
untagged: 3
`
	var w trainWith
	w.KL = "k1"
	w.Skip = 9
	if errs := DecodeStrict("w.yaml", node(t, "w.yaml", ok), &w); errs != nil {
		t.Fatal(errs)
	}
	if w.EpsClip != 1 || w.EpsClipHigh == nil || *w.EpsClipHigh != 0.28 || w.KL != "k3" || w.Steps != 7 || w.Chunk != 65535 ||
		!w.Entropy || w.Model != "actor" || !reflect.DeepEqual(w.Dims, []int{1, 2}) || w.Pair != [2]float32{0.5, 1} ||
		w.Opt == nil || w.Opt.Beta1 != 0.9 || w.Tags["a"] != "b" || w.Raw == nil || w.Raw.Kind != yaml.SequenceNode ||
		w.Skip != 9 || w.Untagged != 3 {
		t.Errorf("decoded %+v", w)
	}
	if want := map[string]any{"k": []any{1, "two"}}; !reflect.DeepEqual(w.Any, want) {
		t.Errorf("any = %#v", w.Any)
	}

	// Defaults survive when keys are absent; nil and null nodes decode
	// nothing but still miss required keys.
	w = trainWith{KL: "k1", Model: "m"}
	for _, n := range []*yaml.Node{nil, node(t, "n.yaml", "null\n")} {
		if errs := DecodeStrict("n.yaml", n, &w); len(errs) != 1 || !strings.Contains(errs[0].Msg, `missing required key "model"`) {
			t.Errorf("decode: %v", errs)
		}
	}
	if errs := DecodeStrict("n.yaml", node(t, "n.yaml", "inline: x\nmodel: m\n"), &w); errs != nil {
		t.Errorf("decode: %v", errs)
	}
	if w.KL != "k1" || w.Inline != "x" {
		t.Errorf("defaults lost: %+v", w)
	}

	tests := []struct {
		src   string
		wants []string // "line:col message" substrings, in order
	}{
		{"model: a\neps: 0.2\n", []string{`2:1: unknown key "eps" in with (did you mean "eps_clip"?)`}},
		{"model: a\nfoo: 1\n", []string{`2:1: unknown key "foo" in with (known: eps_clip, eps_clip_high, kl, steps, chunk, entropy, model, dims, pair, opt, tags, raw, any, untagged, inline)`}},
		{"model: a\nmodel: b\n", []string{`2:1: duplicate key "model" in with (first at line 1)`}},
		{"eps_clip: x\n", []string{`1:1: with: missing required key "model"`, `1:11: with.eps_clip: want a number, got string "x"`}},
		{"model: 1\n", []string{`1:8: with.model: want a string, got integer 1`}},
		{"model: a\nsteps: 1.5\n", []string{`2:8: with.steps: want an integer, got float 1.5`}},
		{"model: a\nsteps: 3000000000\n", []string{`2:8: with.steps: integer 3000000000 out of range`}},
		{"model: a\nchunk: -1\n", []string{`2:8: with.chunk: must not be negative`}},
		{"model: a\nchunk: 70000\n", []string{`2:8: with.chunk: integer 70000 out of range`}},
		{"model: a\nentropy: yes\n", []string{`2:10: with.entropy: want a boolean (true or false), got string "yes"`}},
		{"model: a\ndims: 3\n", []string{`2:7: with.dims: want a list, got integer 3`}},
		{"model: a\ndims: [1, x]\n", []string{`2:11: with.dims[1]: want an integer`}},
		{"model: a\npair: [1]\n", []string{`2:7: with.pair: want a list of 2, got a list of 1`}},
		{"model: a\nopt: {beta2: 1}\n", []string{`2:7: unknown key "beta2" in with.opt (did you mean "beta1"?)`}},
		{"model: a\nopt: 3\n", []string{`2:6: with.opt: want a mapping, got integer 3`}},
		{"model: a\ntags: {a: 1}\n", []string{`2:11: with.tags.a: want a string, got integer 1`}},
		{"model: a\npair: [1e39, 0]\n", []string{`2:8: with.pair[0]: number 1e39 out of range`}},
		{"- a\n", []string{`1:1: with: want a mapping, got a list`}},
	}
	for _, tt := range tests {
		var w trainWith
		errs := DecodeStrict("d.yaml", node(t, "d.yaml", tt.src), &w)
		if len(errs) != len(tt.wants) {
			t.Errorf("%q: got %d errors, want %d:\n%v", tt.src, len(errs), len(tt.wants), errs)
			continue
		}
		for i, e := range errs {
			if got := posLC(e.Pos) + ": " + e.Msg; !strings.Contains(got, tt.wants[i]) {
				t.Errorf("%q: error %d = %q, want %q", tt.src, i, got, tt.wants[i])
			}
		}
	}

	if errs := DecodeStrict("d.yaml", nil, w); len(errs) != 1 || !strings.Contains(errs[0].Msg, "non-nil pointer to a struct") {
		t.Errorf("non-pointer: %v", errs)
	}
}

func TestStageDecodeWith(t *testing.T) {
	src := minimal + "stages:\n  step:\n    - id: a\n      uses: train\n      with: {eps_clip: x, model: m}\n    - id: b\n      uses: train\n"
	s, err := Parse("sw.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	var w trainWith
	errs := s.Step[0].DecodeWith(&w)
	if len(errs) != 1 || errs[0].Error() != `sw.yaml:16:24: with.eps_clip: want a number, got string "x"` {
		t.Errorf("a: %v", errs)
	}
	errs = s.Step[1].DecodeWith(&w)
	if len(errs) != 1 || errs[0].Error() != `sw.yaml:17:7: with: missing required key "model"` {
		t.Errorf("b: %v", errs)
	}
}
