// Package model reads and writes Hugging Face decoder checkpoints for the
// families rlpipe supports (Llama, Qwen2, Qwen3, Mistral): config.json in both
// the transformers 4 and transformers 5 dialects, the parameter inventory
// grouped into FSDP units, and safetensors headers, sharded checkpoints and
// row-sliced tensor reads.
package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Family is a supported decoder family, spelled as the HF model_type.
type Family string

// The supported families.
const (
	FamilyLlama   Family = "llama"
	FamilyQwen2   Family = "qwen2"
	FamilyQwen3   Family = "qwen3"
	FamilyMistral Family = "mistral"
)

// Families lists the supported families in sorted order.
func Families() []Family {
	return []Family{FamilyLlama, FamilyMistral, FamilyQwen2, FamilyQwen3}
}

// Architecture returns the HF architectures entry for the family, for
// example "Qwen2ForCausalLM", or "" for an unknown family.
func (f Family) Architecture() string {
	switch f {
	case FamilyLlama:
		return "LlamaForCausalLM"
	case FamilyQwen2:
		return "Qwen2ForCausalLM"
	case FamilyQwen3:
		return "Qwen3ForCausalLM"
	case FamilyMistral:
		return "MistralForCausalLM"
	}
	return ""
}

func (f Family) supported() bool { return f.Architecture() != "" }

// readsAttentionBias reports whether transformers reads the attention_bias
// key of config.json for the family: LlamaConfig and Qwen3Config have it;
// Qwen2Config and MistralConfig do not, their attention layers hard-code
// the biases.
func (f Family) readsAttentionBias() bool { return f == FamilyLlama || f == FamilyQwen3 }

// projectionBiases returns whether the q/k/v projections and o_proj carry a
// bias in the family's transformers attention layer, given the
// config.json's attention_bias (ignored by families that do not read it).
// LlamaAttention and Qwen3Attention build all four projections with
// bias=attention_bias; Qwen2Attention has q/k/v biases and no o_proj bias,
// always; MistralAttention has no bias at all.
func (f Family) projectionBiases(attentionBias bool) (qkv, out bool) {
	switch f {
	case FamilyQwen2:
		return true, false
	case FamilyMistral:
		return false, false
	}
	return attentionBias, attentionBias
}

// ErrUnsupported is wrapped by errors about values that are well formed but
// that rlpipe does not implement (a model_type, a rope type, a dtype).
var ErrUnsupported = errors.New("unsupported")

// ConfigError is an error in a config.json. File is the name given to
// ParseConfig (the path for LoadConfig), Key the offending JSON key ("" when
// the problem is not tied to one key, dotted for nested keys such as
// "rope_scaling.factor").
type ConfigError struct {
	File string
	Key  string
	Msg  string
	Err  error // underlying error, for example ErrUnsupported; may be nil
}

// Error formats the error as "file: message".
func (e *ConfigError) Error() string { return e.File + ": " + e.Msg }

// Unwrap returns the underlying error.
func (e *ConfigError) Unwrap() error { return e.Err }

// RopeScaling describes non-default rotary embedding scaling. Type is
// "llama3" or "linear". Factor applies to both; LowFreqFactor,
// HighFreqFactor and OriginalMaxPositionEmbeddings only to llama3.
type RopeScaling struct {
	Type                          string
	Factor                        float64
	LowFreqFactor                 float64
	HighFreqFactor                float64
	OriginalMaxPositionEmbeddings int
}

// Config is the architecture of a decoder checkpoint, read from an HF
// config.json.
type Config struct {
	// Source is the name the config was parsed under (its path for LoadConfig).
	Source string
	Family Family

	HiddenSize            int
	IntermediateSize      int
	NumLayers             int
	NumHeads              int
	NumKVHeads            int
	HeadDim               int // explicit head_dim, or HiddenSize/NumHeads
	VocabSize             int
	MaxPositionEmbeddings int

	RMSNormEps  float64
	RopeTheta   float64
	RopeScaling *RopeScaling // nil for default rope

	TieWordEmbeddings bool
	AttentionBias     bool // q/k/v projections carry a bias
	OutputBias        bool // o_proj carries a bias (llama and qwen3 with attention_bias)
	QKNorm            bool // per-head RMSNorm on q and k (qwen3)
	SlidingWindow     int  // attention window in tokens; 0 when attention is full

	// DType is the checkpoint dtype: "bfloat16", "float16" or "float32"
	// ("float32" when the config names none, as transformers assumes).
	DType string

	// Raw is the config.json as read; MarshalHF keeps its unknown keys.
	Raw json.RawMessage
}

// Supported dtype spellings in config.json.
var configDTypes = map[string]bool{"bfloat16": true, "float16": true, "float32": true}

// Upper bounds on dimensions; they keep every product in NumParams far from
// int64 overflow and reject absurd values early.
const (
	maxDim    = 1 << 20
	maxVocab  = 1 << 24
	maxLayers = 1 << 12
)

// LoadConfig reads the config.json at path; path may also name a checkpoint
// directory holding a config.json.
func LoadConfig(path string) (*Config, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "config.json")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read model config: %w", err)
	}
	return ParseConfig(path, data)
}

// ParseConfig parses config.json contents; name is used in errors. Both the
// transformers 4 dialect (rope_theta, rope_scaling, torch_dtype) and the
// transformers 5 dialect (rope_parameters, dtype) are accepted. The
// projection biases follow transformers: attention_bias gives llama and
// qwen3 q/k/v and o_proj biases; qwen2 always has q/k/v biases and no o_proj
// bias, mistral no bias at all, and both ignore attention_bias. All
// problems found are reported, joined with errors.Join; each is a
// *ConfigError.
func ParseConfig(name string, data []byte) (*Config, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, &ConfigError{File: name, Msg: "invalid JSON: " + err.Error(), Err: err}
	}
	if m == nil {
		return nil, &ConfigError{File: name, Msg: "invalid JSON: want an object, got null"}
	}
	p := &parser{file: name, m: m}
	c := &Config{Source: name, Raw: append(json.RawMessage(nil), data...)}

	mt, ok := p.str("model_type")
	if !ok {
		if _, present := p.get("model_type"); !present {
			p.errorf("model_type", nil, "missing required key %q", "model_type")
		}
		return nil, p.err()
	}
	c.Family = Family(mt)
	if !c.Family.supported() {
		names := make([]string, 0, 4)
		for _, f := range Families() {
			names = append(names, string(f))
		}
		p.errorf("model_type", ErrUnsupported, "unsupported model_type %q (supported: %s)", mt, strings.Join(names, ", "))
		return nil, p.err()
	}

	c.HiddenSize = p.reqInt("hidden_size")
	c.IntermediateSize = p.reqInt("intermediate_size")
	c.NumLayers = p.reqInt("num_hidden_layers")
	c.NumHeads = p.reqInt("num_attention_heads")
	c.VocabSize = p.reqInt("vocab_size")
	c.NumKVHeads = p.optInt("num_key_value_heads", c.NumHeads)
	headDimSet := false
	if _, ok := p.get("head_dim"); ok {
		c.HeadDim = p.reqInt("head_dim")
		headDimSet = true
	}
	c.MaxPositionEmbeddings = p.optInt("max_position_embeddings", defaultMaxPositions(c.Family))
	c.RMSNormEps = p.optFloat("rms_norm_eps", 1e-6)
	c.TieWordEmbeddings = p.optBool("tie_word_embeddings", false)

	attentionBias := false
	if c.Family.readsAttentionBias() {
		attentionBias = p.optBool("attention_bias", false)
	}
	c.AttentionBias, c.OutputBias = c.Family.projectionBiases(attentionBias)
	switch c.Family {
	case FamilyQwen2:
		if p.optBool("use_sliding_window", false) {
			c.SlidingWindow = p.optInt("sliding_window", 0)
		}
	case FamilyQwen3:
		c.QKNorm = true
		if p.optBool("use_sliding_window", false) {
			c.SlidingWindow = p.optInt("sliding_window", 0)
		}
	case FamilyLlama:
		if p.optBool("mlp_bias", false) {
			p.errorf("mlp_bias", ErrUnsupported, "mlp_bias true is unsupported")
		}
	case FamilyMistral:
		c.SlidingWindow = p.optInt("sliding_window", 0)
	}
	p.layerTypes(c)
	if act, ok := p.str("hidden_act"); ok && act != "silu" {
		p.errorf("hidden_act", ErrUnsupported, "unsupported hidden_act %q (supported: silu)", act)
	}

	c.DType = p.dtype()
	c.RopeTheta, c.RopeScaling = p.rope()

	if err := p.err(); err != nil {
		return nil, err
	}
	if !headDimSet && c.NumHeads > 0 {
		if c.HiddenSize%c.NumHeads != 0 {
			return nil, &ConfigError{File: name, Key: "num_attention_heads",
				Msg: fmt.Sprintf("num_attention_heads %d does not divide hidden_size %d", c.NumHeads, c.HiddenSize)}
		}
		c.HeadDim = c.HiddenSize / c.NumHeads
	}
	if err := c.validate(name); err != nil {
		return nil, err
	}
	return c, nil
}

func defaultMaxPositions(f Family) int {
	switch f {
	case FamilyLlama:
		return 2048
	case FamilyMistral:
		return 4096 * 32
	}
	return 32768
}

// Validate checks the internal consistency of a config, for example one
// built in code rather than parsed.
func (c *Config) Validate() error {
	name := c.Source
	if name == "" {
		name = "config"
	}
	return c.validate(name)
}

func (c *Config) validate(name string) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &ConfigError{File: name, Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	if !c.Family.supported() {
		errs = append(errs, &ConfigError{File: name, Key: "model_type", Err: ErrUnsupported,
			Msg: fmt.Sprintf("unsupported model_type %q", c.Family)})
	}
	dims := []struct {
		key string
		v   int
		max int
	}{
		{"hidden_size", c.HiddenSize, maxDim},
		{"intermediate_size", c.IntermediateSize, maxDim},
		{"num_hidden_layers", c.NumLayers, maxLayers},
		{"num_attention_heads", c.NumHeads, maxDim},
		{"num_key_value_heads", c.NumKVHeads, maxDim},
		{"head_dim", c.HeadDim, maxDim},
		{"vocab_size", c.VocabSize, maxVocab},
		{"max_position_embeddings", c.MaxPositionEmbeddings, math.MaxInt32},
	}
	ok := true
	for _, d := range dims {
		if d.v <= 0 || d.v > d.max {
			bad(d.key, "%s %d out of range [1, %d]", d.key, d.v, d.max)
			ok = false
		}
	}
	if ok {
		if c.NumHeads%c.NumKVHeads != 0 {
			bad("num_key_value_heads", "num_key_value_heads %d does not divide num_attention_heads %d", c.NumKVHeads, c.NumHeads)
		}
		if c.HeadDim%2 != 0 {
			bad("head_dim", "head_dim %d is odd; rotary embeddings need an even head_dim", c.HeadDim)
		}
	}
	if c.Family.supported() {
		if qkv, out := c.Family.projectionBiases(c.AttentionBias); qkv != c.AttentionBias || out != c.OutputBias {
			bad("attention_bias", "%s cannot have q/k/v bias %v with o_proj bias %v (transformers builds %v and %v)",
				c.Family, c.AttentionBias, c.OutputBias, qkv, out)
		}
	}
	if c.SlidingWindow < 0 {
		bad("sliding_window", "sliding_window %d is negative", c.SlidingWindow)
	}
	if !(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0) {
		bad("rms_norm_eps", "rms_norm_eps %v must be positive", c.RMSNormEps)
	}
	if !(c.RopeTheta > 0) || math.IsInf(c.RopeTheta, 0) {
		bad("rope_theta", "rope_theta %v must be positive", c.RopeTheta)
	}
	if !configDTypes[c.DType] {
		errs = append(errs, &ConfigError{File: name, Key: "torch_dtype", Err: ErrUnsupported,
			Msg: fmt.Sprintf("unsupported dtype %q (supported: bfloat16, float16, float32)", c.DType)})
	}
	if rs := c.RopeScaling; rs != nil {
		switch rs.Type {
		case "linear":
			if !(rs.Factor >= 1) || math.IsInf(rs.Factor, 0) {
				bad("rope_scaling.factor", "rope_scaling factor %v must be at least 1", rs.Factor)
			}
		case "llama3":
			if !(rs.Factor >= 1) || math.IsInf(rs.Factor, 0) {
				bad("rope_scaling.factor", "rope_scaling factor %v must be at least 1", rs.Factor)
			}
			if !(rs.LowFreqFactor > 0) || !(rs.HighFreqFactor > rs.LowFreqFactor) || math.IsInf(rs.HighFreqFactor, 0) {
				bad("rope_scaling.high_freq_factor", "rope_scaling needs 0 < low_freq_factor < high_freq_factor, got %v and %v",
					rs.LowFreqFactor, rs.HighFreqFactor)
			}
			if rs.OriginalMaxPositionEmbeddings <= 0 {
				bad("rope_scaling.original_max_position_embeddings",
					"rope_scaling original_max_position_embeddings %d must be positive", rs.OriginalMaxPositionEmbeddings)
			}
		default:
			errs = append(errs, &ConfigError{File: name, Key: "rope_scaling.rope_type", Err: ErrUnsupported,
				Msg: fmt.Sprintf("unsupported rope type %q (supported: default, linear, llama3)", rs.Type)})
		}
	}
	return errors.Join(errs...)
}

// parser reads typed values out of a decoded JSON object and collects
// errors. prefix is prepended to keys in errors, for nested objects.
type parser struct {
	file   string
	prefix string
	m      map[string]json.RawMessage
	errs   *[]error
}

func (p *parser) errorf(key string, err error, format string, args ...any) {
	if p.errs == nil {
		p.errs = new([]error)
	}
	*p.errs = append(*p.errs, &ConfigError{File: p.file, Key: p.prefix + key, Msg: fmt.Sprintf(format, args...), Err: err})
}

func (p *parser) err() error {
	if p.errs == nil {
		return nil
	}
	return errors.Join(*p.errs...)
}

// sub returns a parser for a nested object sharing p's error list.
func (p *parser) sub(key string, m map[string]json.RawMessage) *parser {
	if p.errs == nil {
		p.errs = new([]error)
	}
	return &parser{file: p.file, prefix: p.prefix + key + ".", m: m, errs: p.errs}
}

// get returns the raw value of key; a JSON null counts as absent.
func (p *parser) get(key string) (json.RawMessage, bool) {
	r, ok := p.m[key]
	if !ok || bytes.Equal(bytes.TrimSpace(r), []byte("null")) {
		return nil, false
	}
	return r, true
}

func (p *parser) number(key string) (float64, bool) {
	r, ok := p.get(key)
	if !ok {
		return 0, false
	}
	var f float64
	if err := json.Unmarshal(r, &f); err != nil {
		p.errorf(key, nil, "%s%s: want a number, got %s", p.prefix, key, shorten(r))
		return 0, false
	}
	return f, true
}

func (p *parser) integer(key string) (int, bool) {
	f, ok := p.number(key)
	if !ok {
		return 0, false
	}
	if f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		p.errorf(key, nil, "%s%s: want an integer, got %v", p.prefix, key, f)
		return 0, false
	}
	return int(f), true
}

func (p *parser) reqInt(key string) int {
	if _, ok := p.get(key); !ok {
		p.errorf(key, nil, "missing required key %q", p.prefix+key)
		return 0
	}
	v, _ := p.integer(key)
	return v
}

func (p *parser) optInt(key string, def int) int {
	if _, ok := p.get(key); !ok {
		return def
	}
	v, _ := p.integer(key)
	return v
}

func (p *parser) optFloat(key string, def float64) float64 {
	if _, ok := p.get(key); !ok {
		return def
	}
	v, _ := p.number(key)
	return v
}

func (p *parser) optBool(key string, def bool) bool {
	r, ok := p.get(key)
	if !ok {
		return def
	}
	var b bool
	if err := json.Unmarshal(r, &b); err != nil {
		p.errorf(key, nil, "%s%s: want a boolean, got %s", p.prefix, key, shorten(r))
		return def
	}
	return b
}

func (p *parser) str(key string) (string, bool) {
	r, ok := p.get(key)
	if !ok {
		return "", false
	}
	var s string
	if err := json.Unmarshal(r, &s); err != nil {
		p.errorf(key, nil, "%s%s: want a string, got %s", p.prefix, key, shorten(r))
		return "", false
	}
	return s, true
}

func (p *parser) object(key string) (map[string]json.RawMessage, bool) {
	r, ok := p.get(key)
	if !ok {
		return nil, false
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(r, &m); err != nil {
		p.errorf(key, nil, "%s%s: want an object, got %s", p.prefix, key, shorten(r))
		return nil, false
	}
	return m, true
}

// layerTypes checks the transformers 5 layer_types list. Only uniform
// attention is supported: all "full_attention", or all "sliding_attention"
// with a sliding_window.
func (p *parser) layerTypes(c *Config) {
	r, ok := p.get("layer_types")
	if !ok {
		return
	}
	var types []string
	if err := json.Unmarshal(r, &types); err != nil {
		p.errorf("layer_types", nil, "layer_types: want a list of strings, got %s", shorten(r))
		return
	}
	if c.NumLayers > 0 && len(types) != c.NumLayers {
		p.errorf("layer_types", nil, "layer_types has %d entries, num_hidden_layers is %d", len(types), c.NumLayers)
		return
	}
	n := map[string]int{}
	for _, t := range types {
		switch t {
		case "full_attention", "sliding_attention":
			n[t]++
		default:
			p.errorf("layer_types", ErrUnsupported, "unsupported layer type %q (supported: full_attention, sliding_attention)", t)
			return
		}
	}
	switch {
	case n["sliding_attention"] == 0:
		c.SlidingWindow = 0
	case n["full_attention"] > 0:
		p.errorf("layer_types", ErrUnsupported, "layer_types mixes full and sliding attention, which is unsupported")
	default:
		c.SlidingWindow = p.optInt("sliding_window", 0)
		if c.SlidingWindow <= 0 {
			p.errorf("sliding_window", nil, "sliding_attention layers need a positive sliding_window")
		}
	}
}

// dtype reads dtype (transformers 5) or torch_dtype (transformers 4).
func (p *parser) dtype() string {
	d5, ok5 := p.str("dtype")
	d4, ok4 := p.str("torch_dtype")
	switch {
	case ok5 && ok4 && d5 != d4:
		p.errorf("dtype", nil, "dtype %q conflicts with torch_dtype %q", d5, d4)
		return d5
	case ok5:
		if !configDTypes[d5] {
			p.errorf("dtype", ErrUnsupported, "unsupported dtype %q (supported: bfloat16, float16, float32)", d5)
		}
		return d5
	case ok4:
		if !configDTypes[d4] {
			p.errorf("torch_dtype", ErrUnsupported, "unsupported torch_dtype %q (supported: bfloat16, float16, float32)", d4)
		}
		return d4
	}
	return "float32"
}

// rope reads rope_theta and the scaling from either dialect. In the
// transformers 5 dialect rope_parameters holds rope_theta, rope_type and
// the scaling parameters; in transformers 4 they are the top-level
// rope_theta and the rope_scaling object.
func (p *parser) rope() (float64, *RopeScaling) {
	theta := p.optFloat("rope_theta", 10000)
	_, topTheta := p.get("rope_theta")
	scaling, hasScaling := p.object("rope_scaling")
	params, hasParams := p.object("rope_parameters")
	if hasParams {
		if hasScaling {
			p.errorf("rope_scaling", nil, "both rope_scaling and rope_parameters are set; use one")
		}
		q := p.sub("rope_parameters", params)
		if _, ok := q.get("rope_theta"); ok {
			t := q.optFloat("rope_theta", theta)
			if topTheta && t != theta {
				p.errorf("rope_theta", nil, "rope_theta %v conflicts with rope_parameters.rope_theta %v", theta, t)
			}
			theta = t
		}
		return theta, q.scaling()
	}
	if hasScaling {
		return theta, p.sub("rope_scaling", scaling).scaling()
	}
	return theta, nil
}

// scaling reads a rope scaling object (rope_scaling or rope_parameters);
// the type key is rope_type, or type in older configs.
func (p *parser) scaling() *RopeScaling {
	typ, ok := p.str("rope_type")
	if !ok {
		typ, ok = p.str("type")
	}
	if !ok || typ == "default" {
		return nil
	}
	rs := &RopeScaling{Type: typ}
	switch typ {
	case "linear":
		rs.Factor = p.reqFloat("factor")
	case "llama3":
		rs.Factor = p.reqFloat("factor")
		rs.LowFreqFactor = p.reqFloat("low_freq_factor")
		rs.HighFreqFactor = p.reqFloat("high_freq_factor")
		rs.OriginalMaxPositionEmbeddings = p.reqInt("original_max_position_embeddings")
	default:
		p.errorf("rope_type", ErrUnsupported, "unsupported rope type %q (supported: default, linear, llama3)", typ)
		return nil
	}
	return rs
}

func (p *parser) reqFloat(key string) float64 {
	if _, ok := p.get(key); !ok {
		p.errorf(key, nil, "missing required key %q", p.prefix+key)
		return 0
	}
	v, _ := p.number(key)
	return v
}

func shorten(r json.RawMessage) string {
	s := string(bytes.TrimSpace(r))
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return s
}

// MarshalHF renders the config as an HF config.json in the transformers 4
// dialect (rope_theta, rope_scaling, torch_dtype). Keys of Raw that Config
// does not model (bos_token_id, for example) are kept; the transformers 5
// keys rope_parameters and dtype are replaced by their transformers 4
// forms. attention_bias, which sets both the q/k/v and the o_proj biases,
// is written for llama and qwen3 only: Qwen2Config and MistralConfig have no
// such key, so a copy of it in Raw is dropped. Keys are sorted and the
// output ends with a newline.
func (c *Config) MarshalHF() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	out := map[string]any{}
	if len(c.Raw) > 0 {
		// Unknown keys are copied as raw JSON, exactly as they were written.
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(c.Raw, &raw); err != nil {
			return nil, fmt.Errorf("config raw JSON: %w", err)
		}
		for k, v := range raw {
			out[k] = v
		}
	}
	delete(out, "rope_parameters")
	delete(out, "dtype")
	out["architectures"] = []string{c.Family.Architecture()}
	out["model_type"] = string(c.Family)
	out["hidden_size"] = c.HiddenSize
	out["intermediate_size"] = c.IntermediateSize
	out["num_hidden_layers"] = c.NumLayers
	out["num_attention_heads"] = c.NumHeads
	out["num_key_value_heads"] = c.NumKVHeads
	if _, had := out["head_dim"]; had || c.Family == FamilyQwen3 || c.HeadDim*c.NumHeads != c.HiddenSize {
		out["head_dim"] = c.HeadDim
	}
	out["vocab_size"] = c.VocabSize
	out["max_position_embeddings"] = c.MaxPositionEmbeddings
	out["rms_norm_eps"] = c.RMSNormEps
	out["rope_theta"] = c.RopeTheta
	if rs := c.RopeScaling; rs != nil {
		m := map[string]any{"rope_type": rs.Type, "factor": rs.Factor}
		if rs.Type == "llama3" {
			m["low_freq_factor"] = rs.LowFreqFactor
			m["high_freq_factor"] = rs.HighFreqFactor
			m["original_max_position_embeddings"] = rs.OriginalMaxPositionEmbeddings
		}
		out["rope_scaling"] = m
	} else {
		out["rope_scaling"] = nil
	}
	out["tie_word_embeddings"] = c.TieWordEmbeddings
	// attention_bias drives the q/k/v and o_proj biases together where
	// transformers reads it; elsewhere the key would only mislead.
	if c.Family.readsAttentionBias() {
		out["attention_bias"] = c.AttentionBias
	} else {
		delete(out, "attention_bias")
	}
	switch c.Family {
	case FamilyQwen2, FamilyQwen3:
		out["use_sliding_window"] = c.SlidingWindow > 0
		if c.SlidingWindow > 0 {
			out["sliding_window"] = c.SlidingWindow
		}
	case FamilyMistral:
		if c.SlidingWindow > 0 {
			out["sliding_window"] = c.SlidingWindow
		} else {
			out["sliding_window"] = nil
		}
	}
	out["hidden_act"] = "silu"
	out["torch_dtype"] = c.DType
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode config: %w", err)
	}
	return append(b, '\n'), nil
}

// sortedKeys returns the keys of m in sorted order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// EOSTokenIDs returns the config's eos_token_id (an int or a list of ints
// in config.json), or nil when it names none.
func (c *Config) EOSTokenIDs() []int {
	var raw struct {
		EOS json.RawMessage `json:"eos_token_id"`
	}
	if len(c.Raw) == 0 || json.Unmarshal(c.Raw, &raw) != nil || len(raw.EOS) == 0 || string(raw.EOS) == "null" {
		return nil
	}
	var one int
	if json.Unmarshal(raw.EOS, &one) == nil {
		return []int{one}
	}
	var many []int
	if json.Unmarshal(raw.EOS, &many) == nil {
		return many
	}
	return nil
}
