package model

import "fmt"

// UnitKind is the kind of an FSDP unit.
type UnitKind string

// The unit kinds: the token embedding, one decoder layer, and the final
// norm with the LM head.
const (
	UnitEmbed   UnitKind = "embed"
	UnitDecoder UnitKind = "decoder"
	UnitHead    UnitKind = "head"
)

// Param is one parameter tensor, named as in HF checkpoints.
type Param struct {
	Name  string
	Shape []int64
}

// NumElements returns the number of elements of the parameter.
func (p Param) NumElements() int64 { return numElements(p.Shape) }

// Unit is one FSDP unit: a group of parameters gathered and resharded
// together. Index is the layer index for decoder units, -1 for the embedding
// and NumLayers for the head.
type Unit struct {
	Kind   UnitKind
	Index  int
	Params []Param
}

// NumParams returns the number of parameter elements in the unit.
func (u Unit) NumParams() int64 {
	var n int64
	for _, p := range u.Params {
		n += p.NumElements()
	}
	return n
}

// Units returns the parameter inventory in execution order: the embedding
// unit, one unit per decoder layer, then the head unit. With tied word
// embeddings the head unit holds only model.norm.weight; the LM head reuses
// model.embed_tokens.weight from the embedding unit.
func (c *Config) Units() []Unit {
	h := int64(c.HiddenSize)
	v := int64(c.VocabSize)
	inter := int64(c.IntermediateSize)
	d := int64(c.HeadDim)
	qDim := int64(c.NumHeads) * d
	kvDim := int64(c.NumKVHeads) * d

	units := make([]Unit, 0, max(c.NumLayers, 0)+2)
	units = append(units, Unit{Kind: UnitEmbed, Index: -1, Params: []Param{
		{Name: "model.embed_tokens.weight", Shape: []int64{v, h}},
	}})
	for i := 0; i < c.NumLayers; i++ {
		pre := fmt.Sprintf("model.layers.%d.", i)
		ps := make([]Param, 0, 16)
		add := func(name string, shape ...int64) {
			ps = append(ps, Param{Name: pre + name, Shape: shape})
		}
		add("input_layernorm.weight", h)
		add("self_attn.q_proj.weight", qDim, h)
		if c.AttentionBias {
			add("self_attn.q_proj.bias", qDim)
		}
		add("self_attn.k_proj.weight", kvDim, h)
		if c.AttentionBias {
			add("self_attn.k_proj.bias", kvDim)
		}
		add("self_attn.v_proj.weight", kvDim, h)
		if c.AttentionBias {
			add("self_attn.v_proj.bias", kvDim)
		}
		add("self_attn.o_proj.weight", h, qDim)
		if c.OutputBias {
			add("self_attn.o_proj.bias", h)
		}
		if c.QKNorm {
			add("self_attn.q_norm.weight", d)
			add("self_attn.k_norm.weight", d)
		}
		add("post_attention_layernorm.weight", h)
		add("mlp.gate_proj.weight", inter, h)
		add("mlp.up_proj.weight", inter, h)
		add("mlp.down_proj.weight", h, inter)
		units = append(units, Unit{Kind: UnitDecoder, Index: i, Params: ps})
	}
	head := Unit{Kind: UnitHead, Index: c.NumLayers, Params: []Param{
		{Name: "model.norm.weight", Shape: []int64{h}},
	}}
	if !c.TieWordEmbeddings {
		head.Params = append(head.Params, Param{Name: "lm_head.weight", Shape: []int64{v, h}})
	}
	return append(units, head)
}

// NumParams returns the total number of parameter elements; a tied
// embedding is counted once.
func (c *Config) NumParams() int64 {
	var n int64
	for _, u := range c.Units() {
		n += u.NumParams()
	}
	return n
}

// inventory maps every parameter name to its shape.
func (c *Config) inventory() map[string][]int64 {
	m := map[string][]int64{}
	for _, u := range c.Units() {
		for _, p := range u.Params {
			m[p.Name] = p.Shape
		}
	}
	return m
}

func numElements(shape []int64) int64 {
	n := int64(1)
	for _, s := range shape {
		n *= s
	}
	return n
}
