package model

import (
	"slices"
	"strings"
	"testing"
)

// handCount computes the parameter count of a config from the architecture
// formulas, independently of Units.
func handCount(c *Config) int64 {
	h, v, in, d := int64(c.HiddenSize), int64(c.VocabSize), int64(c.IntermediateSize), int64(c.HeadDim)
	q, kv := int64(c.NumHeads)*d, int64(c.NumKVHeads)*d
	layer := 2*h + // input and post-attention norms
		h*q + 2*h*kv + q*h + // q, k, v, o projections
		3*in*h // gate, up, down
	if c.AttentionBias {
		layer += q + 2*kv
	}
	if c.OutputBias {
		layer += h // o_proj bias
	}
	if c.QKNorm {
		layer += 2 * d
	}
	total := v*h + int64(c.NumLayers)*layer + h
	if !c.TieWordEmbeddings {
		total += v * h
	}
	return total
}

func TestNumParams(t *testing.T) {
	tests := []struct {
		path string
		want int64 // published totals; 0 to rely on the formula only
	}{
		{"../examples/models/qwen2.5-0.5b/config.json", 494_032_768},
		{"../examples/models/qwen2.5-1.5b/config.json", 1_543_714_304},
		{"../examples/models/qwen2.5-7b/config.json", 7_615_616_512},
		{"../examples/models/llama-3.1-8b/config.json", 8_030_261_248},
		{"testdata/qwen3-t5.json", 596_049_920}, // Qwen3-0.6B
		{"testdata/tiny-llama.json", 0},
		{"testdata/tiny-qwen2.json", 0},
		{"testdata/tiny-qwen3.json", 0},
		{"testdata/tiny-mistral.json", 0},
		{"testdata/tiny-llama-bias.json", 0},
		// The tensors transformers saved for this model hold 107200
		// elements (golden.json checkpoint_tensors), o_proj biases included.
		{"testdata/hf/llama_bias/model/config.json", 107_200},
		{"testdata/hf/llama/model/config.json", 106_816},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			c, err := LoadConfig(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			got := c.NumParams()
			if want := handCount(c); got != want {
				t.Errorf("NumParams = %d, formula gives %d", got, want)
			}
			if tt.want != 0 && got != tt.want {
				t.Errorf("NumParams = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestUnits(t *testing.T) {
	tests := []struct {
		path      string
		perLayer  int // parameters per decoder unit
		headNames []string
		hasBias   bool // q/k/v biases
		hasOBias  bool // o_proj bias
		hasQKNorm bool
	}{
		{"testdata/tiny-llama.json", 9, []string{"model.norm.weight", "lm_head.weight"}, false, false, false},
		{"testdata/tiny-llama-bias.json", 13, []string{"model.norm.weight", "lm_head.weight"}, true, true, false},
		{"testdata/tiny-qwen2.json", 12, []string{"model.norm.weight"}, true, false, false},
		{"testdata/tiny-qwen3.json", 11, []string{"model.norm.weight"}, false, false, true},
		{"testdata/tiny-mistral.json", 9, []string{"model.norm.weight", "lm_head.weight"}, false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			c, err := LoadConfig(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			units := c.Units()
			if len(units) != c.NumLayers+2 {
				t.Fatalf("%d units, want %d", len(units), c.NumLayers+2)
			}
			if u := units[0]; u.Kind != UnitEmbed || u.Index != -1 || len(u.Params) != 1 ||
				u.Params[0].Name != "model.embed_tokens.weight" || u.NumParams() != int64(c.VocabSize*c.HiddenSize) {
				t.Errorf("embed unit %+v", u)
			}
			seen := map[string]bool{}
			for i, u := range units[1 : c.NumLayers+1] {
				if u.Kind != UnitDecoder || u.Index != i || len(u.Params) != tt.perLayer {
					t.Errorf("unit %d: kind %s index %d with %d params", i+1, u.Kind, u.Index, len(u.Params))
				}
				for _, p := range u.Params {
					if seen[p.Name] {
						t.Errorf("duplicate param %s", p.Name)
					}
					seen[p.Name] = true
					if !strings.HasPrefix(p.Name, "model.layers.") {
						t.Errorf("param %s outside model.layers", p.Name)
					}
					if strings.HasSuffix(p.Name, ".bias") && !tt.hasBias && !tt.hasOBias {
						t.Errorf("unexpected bias %s", p.Name)
					}
				}
			}
			name := func(s string) bool { return seen["model.layers.0."+s] }
			if name("self_attn.q_proj.bias") != tt.hasBias || name("self_attn.k_proj.bias") != tt.hasBias {
				t.Errorf("q/k bias present = %v, want %v", name("self_attn.q_proj.bias"), tt.hasBias)
			}
			if name("self_attn.o_proj.bias") != tt.hasOBias {
				t.Errorf("o_proj bias present = %v, want %v", name("self_attn.o_proj.bias"), tt.hasOBias)
			}
			if tt.hasOBias {
				if shape := c.inventory()["model.layers.1.self_attn.o_proj.bias"]; !slices.Equal(shape, []int64{int64(c.HiddenSize)}) {
					t.Errorf("o_proj bias shape %v, want [%d]", shape, c.HiddenSize)
				}
			}
			if name("self_attn.q_norm.weight") != tt.hasQKNorm || name("self_attn.k_norm.weight") != tt.hasQKNorm {
				t.Errorf("q/k norm present = %v, want %v", name("self_attn.q_norm.weight"), tt.hasQKNorm)
			}
			head := units[len(units)-1]
			if head.Kind != UnitHead || head.Index != c.NumLayers {
				t.Errorf("head unit kind %s index %d", head.Kind, head.Index)
			}
			var names []string
			for _, p := range head.Params {
				names = append(names, p.Name)
			}
			if strings.Join(names, ",") != strings.Join(tt.headNames, ",") {
				t.Errorf("head params %v, want %v", names, tt.headNames)
			}
		})
	}
}

func TestUnitShapesQwen3(t *testing.T) {
	c, err := LoadConfig("testdata/tiny-qwen3.json")
	if err != nil {
		t.Fatal(err)
	}
	inv := c.inventory()
	want := map[string][]int64{
		"model.layers.2.self_attn.q_proj.weight": {128, 64}, // 4 heads × head_dim 32
		"model.layers.2.self_attn.k_proj.weight": {64, 64},  // 2 kv heads × 32
		"model.layers.2.self_attn.o_proj.weight": {64, 128},
		"model.layers.2.self_attn.q_norm.weight": {32},
		"model.layers.2.mlp.down_proj.weight":    {64, 96},
		"model.embed_tokens.weight":              {300, 64},
	}
	for name, shape := range want {
		if got := inv[name]; !slices.Equal(got, shape) {
			t.Errorf("%s: shape %v, want %v", name, inv[name], shape)
		}
	}
}
