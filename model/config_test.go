package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// stripped returns a copy of c without the fields that depend on where and
// how it was read, for comparisons.
func stripped(c *Config) Config {
	s := *c
	s.Source = ""
	s.Raw = nil
	return s
}

func equalConfig(t *testing.T, got *Config, want Config) {
	t.Helper()
	g := stripped(got)
	gj, _ := json.Marshal(g)
	wj, _ := json.Marshal(want)
	if string(gj) != string(wj) {
		t.Errorf("config mismatch\n got %s\nwant %s", gj, wj)
	}
}

func TestLoadConfig(t *testing.T) {
	llama3 := &RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}
	tests := []struct {
		path string
		want Config
	}{
		{"../examples/models/qwen2.5-0.5b/config.json", Config{
			Family: FamilyQwen2, HiddenSize: 896, IntermediateSize: 4864, NumLayers: 24, NumHeads: 14, NumKVHeads: 2,
			HeadDim: 64, VocabSize: 151936, MaxPositionEmbeddings: 32768, RMSNormEps: 1e-6, RopeTheta: 1e6,
			TieWordEmbeddings: true, AttentionBias: true, DType: "bfloat16"}},
		{"../examples/models/qwen2.5-1.5b", Config{
			Family: FamilyQwen2, HiddenSize: 1536, IntermediateSize: 8960, NumLayers: 28, NumHeads: 12, NumKVHeads: 2,
			HeadDim: 128, VocabSize: 151936, MaxPositionEmbeddings: 131072, RMSNormEps: 1e-6, RopeTheta: 1e6,
			TieWordEmbeddings: true, AttentionBias: true, DType: "bfloat16"}},
		{"../examples/models/qwen2.5-7b/config.json", Config{
			Family: FamilyQwen2, HiddenSize: 3584, IntermediateSize: 18944, NumLayers: 28, NumHeads: 28, NumKVHeads: 4,
			HeadDim: 128, VocabSize: 152064, MaxPositionEmbeddings: 131072, RMSNormEps: 1e-6, RopeTheta: 1e6,
			AttentionBias: true, DType: "bfloat16"}},
		{"../examples/models/llama-3.1-8b/config.json", Config{
			Family: FamilyLlama, HiddenSize: 4096, IntermediateSize: 14336, NumLayers: 32, NumHeads: 32, NumKVHeads: 8,
			HeadDim: 128, VocabSize: 128256, MaxPositionEmbeddings: 131072, RMSNormEps: 1e-5, RopeTheta: 500000,
			RopeScaling: llama3, DType: "bfloat16"}},
		// The same model in the transformers 5 dialect parses identically.
		{"testdata/llama-t5.json", Config{
			Family: FamilyLlama, HiddenSize: 4096, IntermediateSize: 14336, NumLayers: 32, NumHeads: 32, NumKVHeads: 8,
			HeadDim: 128, VocabSize: 128256, MaxPositionEmbeddings: 131072, RMSNormEps: 1e-5, RopeTheta: 500000,
			RopeScaling: llama3, DType: "bfloat16"}},
		{"testdata/qwen3-t5.json", Config{
			Family: FamilyQwen3, HiddenSize: 1024, IntermediateSize: 3072, NumLayers: 28, NumHeads: 16, NumKVHeads: 8,
			HeadDim: 128, VocabSize: 151936, MaxPositionEmbeddings: 40960, RMSNormEps: 1e-6, RopeTheta: 1e6,
			TieWordEmbeddings: true, QKNorm: true, DType: "bfloat16"}},
		{"testdata/tiny-llama.json", Config{
			Family: FamilyLlama, HiddenSize: 64, IntermediateSize: 160, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
			HeadDim: 16, VocabSize: 256, MaxPositionEmbeddings: 512, RMSNormEps: 1e-5, RopeTheta: 500000,
			RopeScaling: &RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 128},
			DType:       "bfloat16"}},
		{"testdata/tiny-qwen2.json", Config{
			Family: FamilyQwen2, HiddenSize: 64, IntermediateSize: 128, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
			HeadDim: 16, VocabSize: 256, MaxPositionEmbeddings: 1024, RMSNormEps: 1e-6, RopeTheta: 1e6,
			TieWordEmbeddings: true, AttentionBias: true, DType: "float32"}},
		{"testdata/tiny-qwen3.json", Config{
			Family: FamilyQwen3, HiddenSize: 64, IntermediateSize: 96, NumLayers: 3, NumHeads: 4, NumKVHeads: 2,
			HeadDim: 32, VocabSize: 300, MaxPositionEmbeddings: 2048, RMSNormEps: 1e-6, RopeTheta: 1e6,
			TieWordEmbeddings: true, QKNorm: true, DType: "bfloat16"}},
		{"testdata/tiny-llama-bias.json", Config{
			Family: FamilyLlama, HiddenSize: 64, IntermediateSize: 160, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
			HeadDim: 16, VocabSize: 256, MaxPositionEmbeddings: 512, RMSNormEps: 1e-5, RopeTheta: 10000,
			AttentionBias: true, OutputBias: true, DType: "bfloat16"}},
		// Written by transformers 5.17 save_pretrained (gen_goldens.py).
		{"testdata/hf/llama_bias/model", Config{
			Family: FamilyLlama, HiddenSize: 64, IntermediateSize: 128, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
			HeadDim: 16, VocabSize: 256, MaxPositionEmbeddings: 256, RMSNormEps: 1e-6, RopeTheta: 10000,
			AttentionBias: true, OutputBias: true, DType: "float32"}},
		{"testdata/hf/qwen2/model", Config{
			Family: FamilyQwen2, HiddenSize: 64, IntermediateSize: 128, NumLayers: 2, NumHeads: 4, NumKVHeads: 2,
			HeadDim: 16, VocabSize: 256, MaxPositionEmbeddings: 256, RMSNormEps: 1e-6, RopeTheta: 10000,
			TieWordEmbeddings: true, AttentionBias: true, DType: "float32"}},
		{"testdata/tiny-mistral.json", Config{
			Family: FamilyMistral, HiddenSize: 64, IntermediateSize: 224, NumLayers: 2, NumHeads: 8, NumKVHeads: 2,
			HeadDim: 8, VocabSize: 320, MaxPositionEmbeddings: 4096, RMSNormEps: 1e-5, RopeTheta: 1e6,
			DType: "float16"}},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			c, err := LoadConfig(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			equalConfig(t, c, tt.want)
			if len(c.Raw) == 0 || !strings.HasSuffix(c.Source, "config.json") && !strings.HasSuffix(c.Source, ".json") {
				t.Errorf("Source %q, len(Raw) %d", c.Source, len(c.Raw))
			}
		})
	}
}

func TestLoadConfigMissingFile(t *testing.T) {
	_, err := LoadConfig(t.TempDir())
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v, want a not-exist error", err)
	}
}

// base is a valid llama config that the error cases below modify.
const base = `"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
	"num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100`

func TestParseConfigVariants(t *testing.T) {
	tests := []struct {
		name  string
		json  string
		check func(*Config) bool
	}{
		{"kv heads default to heads", `{` + base + `}`, func(c *Config) bool { return c.NumKVHeads == 4 && c.HeadDim == 16 }},
		{"defaults", `{` + base + `}`, func(c *Config) bool {
			return c.DType == "float32" && c.RopeTheta == 10000 && c.RMSNormEps == 1e-6 && c.RopeScaling == nil &&
				c.MaxPositionEmbeddings == 2048 && !c.TieWordEmbeddings && !c.AttentionBias && !c.OutputBias
		}},
		// attention_bias gives Llama and Qwen3 q/k/v and o_proj biases;
		// Qwen2 always has q/k/v biases and never an o_proj bias; Mistral
		// has none. Qwen2Config and MistralConfig do not read the key.
		{"llama attention_bias", `{` + base + `, "attention_bias": true}`,
			func(c *Config) bool { return c.AttentionBias && c.OutputBias }},
		{"llama attention_bias false", `{` + base + `, "attention_bias": false}`,
			func(c *Config) bool { return !c.AttentionBias && !c.OutputBias }},
		{"qwen3 attention_bias", `{` + strings.Replace(base, "llama", "qwen3", 1) + `, "attention_bias": true}`,
			func(c *Config) bool { return c.AttentionBias && c.OutputBias && c.QKNorm }},
		{"qwen3 default", `{` + strings.Replace(base, "llama", "qwen3", 1) + `}`,
			func(c *Config) bool { return !c.AttentionBias && !c.OutputBias }},
		{"qwen2 default", `{` + strings.Replace(base, "llama", "qwen2", 1) + `}`,
			func(c *Config) bool { return c.AttentionBias && !c.OutputBias }},
		{"qwen2 ignores attention_bias", `{` + strings.Replace(base, "llama", "qwen2", 1) + `, "attention_bias": false}`,
			func(c *Config) bool { return c.AttentionBias && !c.OutputBias }},
		{"mistral ignores attention_bias", `{` + strings.Replace(base, "llama", "mistral", 1) + `, "attention_bias": true}`,
			func(c *Config) bool { return !c.AttentionBias && !c.OutputBias }},
		{"explicit head_dim", `{` + base + `, "head_dim": 32}`, func(c *Config) bool { return c.HeadDim == 32 }},
		{"legacy rope type key", `{` + base + `, "rope_scaling": {"type": "linear", "factor": 2}}`,
			func(c *Config) bool {
				return c.RopeScaling != nil && c.RopeScaling.Type == "linear" && c.RopeScaling.Factor == 2
			}},
		{"default rope type", `{` + base + `, "rope_scaling": {"rope_type": "default"}}`, func(c *Config) bool { return c.RopeScaling == nil }},
		{"t5 linear", `{` + base + `, "rope_parameters": {"rope_type": "linear", "factor": 4, "rope_theta": 1234}}`,
			func(c *Config) bool {
				return c.RopeTheta == 1234 && c.RopeScaling.Type == "linear" && c.RopeScaling.Factor == 4
			}},
		{"t5 theta agrees with top level", `{` + base + `, "rope_theta": 5, "rope_parameters": {"rope_theta": 5}}`,
			func(c *Config) bool { return c.RopeTheta == 5 && c.RopeScaling == nil }},
		{"dtype and torch_dtype agree", `{` + base + `, "dtype": "float16", "torch_dtype": "float16"}`,
			func(c *Config) bool { return c.DType == "float16" }},
		{"integral float", `{` + base + `, "num_key_value_heads": 2.0}`, func(c *Config) bool { return c.NumKVHeads == 2 }},
		{"mistral sliding window", `{` + strings.Replace(base, "llama", "mistral", 1) + `, "sliding_window": 4096}`,
			func(c *Config) bool { return c.SlidingWindow == 4096 }},
		{"uniform full layer types", `{` + base + `, "layer_types": ["full_attention", "full_attention"]}`,
			func(c *Config) bool { return c.SlidingWindow == 0 }},
		{"uniform sliding layer types", `{` + strings.Replace(base, "llama", "qwen2", 1) + `, "sliding_window": 16, "layer_types": ["sliding_attention", "sliding_attention"]}`,
			func(c *Config) bool { return c.SlidingWindow == 16 }},
		{"qwen2 sliding window off", `{` + strings.Replace(base, "llama", "qwen2", 1) + `, "sliding_window": 4096, "use_sliding_window": false}`,
			func(c *Config) bool { return c.SlidingWindow == 0 && c.AttentionBias }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseConfig("config.json", []byte(tt.json))
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Errorf("unexpected config %+v", *c)
			}
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name        string
		json        string
		want        string // exact error text
		key         string // Key of the first ConfigError
		unsupported bool
	}{
		{"heads do not divide", `{"model_type": "qwen2", "hidden_size": 900, "intermediate_size": 128,
			"num_hidden_layers": 2, "num_attention_heads": 14, "vocab_size": 100}`,
			"config.json: num_attention_heads 14 does not divide hidden_size 900", "num_attention_heads", false},
		{"unknown model_type", `{"model_type": "gpt2"}`,
			`config.json: unsupported model_type "gpt2" (supported: llama, mistral, qwen2, qwen3)`, "model_type", true},
		{"missing model_type", `{"hidden_size": 64}`, `config.json: missing required key "model_type"`, "model_type", false},
		{"missing keys", `{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}`,
			"config.json: missing required key \"intermediate_size\"\nconfig.json: missing required key \"vocab_size\"", "intermediate_size", false},
		{"wrong type", `{` + base + `, "num_key_value_heads": "two"}`,
			`config.json: num_key_value_heads: want a number, got "two"`, "num_key_value_heads", false},
		{"not an integer", `{` + base + `, "num_key_value_heads": 1.5}`,
			`config.json: num_key_value_heads: want an integer, got 1.5`, "num_key_value_heads", false},
		{"kv heads do not divide", `{` + base + `, "num_key_value_heads": 3}`,
			"config.json: num_key_value_heads 3 does not divide num_attention_heads 4", "num_key_value_heads", false},
		{"zero layers", `{` + strings.Replace(base, `"num_hidden_layers": 2`, `"num_hidden_layers": 0`, 1) + `}`,
			"config.json: num_hidden_layers 0 out of range [1, 4096]", "num_hidden_layers", false},
		{"odd head_dim", `{` + base + `, "head_dim": 15}`,
			"config.json: head_dim 15 is odd; rotary embeddings need an even head_dim", "head_dim", false},
		{"unsupported rope type", `{` + base + `, "rope_scaling": {"rope_type": "yarn", "factor": 4}}`,
			`config.json: unsupported rope type "yarn" (supported: default, linear, llama3)`, "rope_scaling.rope_type", true},
		{"t5 unsupported rope type", `{` + base + `, "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000}}`,
			`config.json: unsupported rope type "dynamic" (supported: default, linear, llama3)`, "rope_parameters.rope_type", true},
		{"llama3 missing factor", `{` + base + `, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}}`,
			`config.json: missing required key "rope_scaling.original_max_position_embeddings"`, "rope_scaling.original_max_position_embeddings", false},
		{"llama3 bad factors", `{` + base + `, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1, "original_max_position_embeddings": 64}}`,
			"config.json: rope_scaling needs 0 < low_freq_factor < high_freq_factor, got 4 and 1", "rope_scaling.high_freq_factor", false},
		{"unsupported dtype", `{` + base + `, "torch_dtype": "float64"}`,
			`config.json: unsupported torch_dtype "float64" (supported: bfloat16, float16, float32)`, "torch_dtype", true},
		{"dtype conflict", `{` + base + `, "dtype": "float16", "torch_dtype": "bfloat16"}`,
			`config.json: dtype "float16" conflicts with torch_dtype "bfloat16"`, "dtype", false},
		{"rope theta conflict", `{` + base + `, "rope_theta": 10000, "rope_parameters": {"rope_theta": 500000}}`,
			"config.json: rope_theta 10000 conflicts with rope_parameters.rope_theta 500000", "rope_theta", false},
		{"both rope objects", `{` + base + `, "rope_scaling": {"rope_type": "linear", "factor": 2}, "rope_parameters": {"rope_theta": 1}}`,
			"config.json: both rope_scaling and rope_parameters are set; use one", "rope_scaling", false},
		{"hidden_act", `{` + base + `, "hidden_act": "gelu"}`,
			`config.json: unsupported hidden_act "gelu" (supported: silu)`, "hidden_act", true},
		{"mlp_bias", `{` + base + `, "mlp_bias": true}`, "config.json: mlp_bias true is unsupported", "mlp_bias", true},
		{"negative eps", `{` + base + `, "rms_norm_eps": -1}`, "config.json: rms_norm_eps -1 must be positive", "rms_norm_eps", false},
		{"bad bool", `{` + base + `, "tie_word_embeddings": "yes"}`,
			`config.json: tie_word_embeddings: want a boolean, got "yes"`, "tie_word_embeddings", false},
		{"huge vocab", `{` + strings.Replace(base, `"vocab_size": 100`, `"vocab_size": 1e12`, 1) + `}`,
			"config.json: vocab_size 1000000000000 out of range [1, 16777216]", "vocab_size", false},
		{"mixed layer types", `{` + base + `, "layer_types": ["full_attention", "sliding_attention"], "sliding_window": 8}`,
			"config.json: layer_types mixes full and sliding attention, which is unsupported", "layer_types", true},
		{"layer types count", `{` + base + `, "layer_types": ["full_attention"]}`,
			"config.json: layer_types has 1 entries, num_hidden_layers is 2", "layer_types", false},
		{"garbage", `{"model_type": `, "config.json: invalid JSON: unexpected end of JSON input", "", false},
		{"null", `null`, "config.json: invalid JSON: want an object, got null", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig("config.json", []byte(tt.json))
			if err == nil {
				t.Fatal("no error")
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got %q\nwant %q", err.Error(), tt.want)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %T is not a *ConfigError", err)
			}
			if ce.Key != tt.key || ce.File != "config.json" {
				t.Errorf("File %q Key %q, want config.json %q", ce.File, ce.Key, tt.key)
			}
			if got := errors.Is(err, ErrUnsupported); got != tt.unsupported {
				t.Errorf("errors.Is(err, ErrUnsupported) = %v, want %v", got, tt.unsupported)
			}
		})
	}
}

func TestMarshalHFRoundTrip(t *testing.T) {
	paths, err := filepath.Glob("testdata/*.json")
	if err != nil {
		t.Fatal(err)
	}
	hf, err := filepath.Glob("testdata/hf/*/model/config.json")
	if err != nil {
		t.Fatal(err)
	}
	paths = append(paths, hf...)
	paths = append(paths, "../examples/models/llama-3.1-8b/config.json")
	for _, p := range paths {
		t.Run(p, func(t *testing.T) {
			c, err := LoadConfig(p)
			if err != nil {
				t.Fatal(err)
			}
			out, err := c.MarshalHF()
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(out, &m); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"rope_parameters", "dtype"} {
				if _, ok := m[k]; ok {
					t.Errorf("transformers 5 key %q written", k)
				}
			}
			if m["torch_dtype"] != c.DType {
				t.Errorf("torch_dtype %v, want %s", m["torch_dtype"], c.DType)
			}
			arch, _ := m["architectures"].([]any)
			if len(arch) != 1 || arch[0] != c.Family.Architecture() {
				t.Errorf("architectures %v", m["architectures"])
			}
			if _, ok := m["bos_token_id"]; strings.Contains(string(c.Raw), "bos_token_id") && !ok {
				t.Error("unknown key bos_token_id dropped")
			}
			// attention_bias is written exactly where transformers reads it.
			ab, ok := m["attention_bias"]
			if reads := c.Family == FamilyLlama || c.Family == FamilyQwen3; ok != reads || ok && ab != c.AttentionBias {
				t.Errorf("attention_bias %v (present %v) for %s with q/k/v bias %v", ab, ok, c.Family, c.AttentionBias)
			}
			back, err := ParseConfig("out.json", out)
			if err != nil {
				t.Fatal(err)
			}
			equalConfig(t, back, stripped(c))
		})
	}
}

func TestMarshalHFFromCode(t *testing.T) {
	c := &Config{Family: FamilyQwen2, HiddenSize: 32, IntermediateSize: 64, NumLayers: 1, NumHeads: 2, NumKVHeads: 1,
		HeadDim: 16, VocabSize: 50, MaxPositionEmbeddings: 128, RMSNormEps: 1e-6, RopeTheta: 1e4,
		TieWordEmbeddings: true, AttentionBias: true, DType: "bfloat16"}
	out, err := c.MarshalHF()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseConfig("out.json", out)
	if err != nil {
		t.Fatal(err)
	}
	equalConfig(t, back, *c)

	c.NumKVHeads = 3
	if _, err := c.MarshalHF(); err == nil {
		t.Error("MarshalHF accepted an invalid config")
	}
}

// TestProjectionBiases checks that Validate accepts exactly the bias
// combinations a transformers config.json can describe, and that MarshalHF
// writes attention_bias only where transformers reads it.
func TestProjectionBiases(t *testing.T) {
	tests := []struct {
		family   Family
		qkv, out bool
		ok       bool
	}{
		{FamilyLlama, false, false, true},
		{FamilyLlama, true, true, true},
		{FamilyLlama, true, false, false},
		{FamilyLlama, false, true, false},
		{FamilyQwen3, true, true, true},
		{FamilyQwen3, true, false, false},
		{FamilyQwen2, true, false, true},
		{FamilyQwen2, false, false, false},
		{FamilyQwen2, true, true, false},
		{FamilyMistral, false, false, true},
		{FamilyMistral, true, false, false},
		{FamilyMistral, true, true, false},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/qkv=%v/o=%v", tt.family, tt.qkv, tt.out), func(t *testing.T) {
			c := &Config{Family: tt.family, HiddenSize: 32, IntermediateSize: 64, NumLayers: 1, NumHeads: 2, NumKVHeads: 1,
				HeadDim: 16, VocabSize: 50, MaxPositionEmbeddings: 128, RMSNormEps: 1e-6, RopeTheta: 1e4,
				AttentionBias: tt.qkv, OutputBias: tt.out, QKNorm: tt.family == FamilyQwen3, DType: "float32",
				// A stray key in the raw config: kept for Llama and Qwen3 only as
				// the value Config holds, dropped for the others.
				Raw: []byte(`{"attention_bias": true}`)}
			err := c.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate: %v, want ok %v", err, tt.ok)
			}
			if !tt.ok {
				var ce *ConfigError
				if !errors.As(err, &ce) || ce.Key != "attention_bias" {
					t.Errorf("error %v, want a ConfigError on attention_bias", err)
				}
				if _, err := c.MarshalHF(); err == nil {
					t.Error("MarshalHF accepted the config")
				}
				return
			}
			out, err := c.MarshalHF()
			if err != nil {
				t.Fatal(err)
			}
			back, err := ParseConfig("out.json", out)
			if err != nil {
				t.Fatal(err)
			}
			if back.AttentionBias != tt.qkv || back.OutputBias != tt.out {
				t.Errorf("read back q/k/v bias %v, o_proj bias %v", back.AttentionBias, back.OutputBias)
			}
			var m map[string]any
			if err := json.Unmarshal(out, &m); err != nil {
				t.Fatal(err)
			}
			ab, ok := m["attention_bias"]
			if reads := tt.family == FamilyLlama || tt.family == FamilyQwen3; ok != reads || ok && ab != tt.qkv {
				t.Errorf("attention_bias = %v (present %v)", ab, ok)
			}
		})
	}
}

// FuzzParseConfig checks that no input makes config parsing, the inventory
// or MarshalHF panic; under plain go test it runs the seed corpus only.
func FuzzParseConfig(f *testing.F) {
	paths, _ := filepath.Glob("testdata/*.json")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig("fuzz.json", b)
		if err != nil {
			return
		}
		if c.NumParams() <= 0 {
			t.Errorf("valid config with %d params", c.NumParams())
		}
		if _, err := c.MarshalHF(); err != nil {
			t.Errorf("MarshalHF of a parsed config: %v", err)
		}
	})
}
