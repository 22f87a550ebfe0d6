package model

import (
	"fmt"
	"slices"
	"strings"

	"github.com/rlpipe/rlpipe/gpu"
)

// EmbedWeightName is the name of the token embedding, which the head of a
// tied model computes with.
const EmbedWeightName = "model.embed_tokens.weight"

// Slot places one parameter in the gathered (unsharded) buffer of an FSDP
// unit. Parameters are sharded on dim 0 as in FSDP2: each of the dp ranks
// holds ShardRows = ceil(rows/dp) rows, and the gathered parameter is
// padded to PaddedRows = dp·ShardRows rows, the padding rows being zero.
type Slot struct {
	// Name is the HF name of the parameter.
	Name string
	// Shape is the unpadded shape of the parameter.
	Shape []int64
	// PaddedRows is dp·ShardRows, the rows the parameter takes in the
	// gathered buffer.
	PaddedRows int64
	// Offset is the element offset of the parameter in the gathered buffer.
	Offset int64
	// ShardRows is ceil(rows/dp), the rows each rank holds.
	ShardRows int64
	// ShardOffset is the element offset of the parameter's slice in a
	// rank's shard of the unit that owns it (the shard holds every owned
	// parameter's ShardRows·RowElems elements, in slot order).
	ShardOffset int64
	// Tied is set on the embedding slot appended to the head of a model
	// with tied word embeddings: the parameter belongs to the embedding
	// unit, whose shard ShardOffset refers to.
	Tied bool
}

// Rows returns dim 0 of the parameter (1 for a zero-rank parameter).
func (s Slot) Rows() int64 {
	if len(s.Shape) == 0 {
		return 1
	}
	return s.Shape[0]
}

// RowElems returns the number of elements in one row (the product of the
// dimensions after the first).
func (s Slot) RowElems() int64 {
	if len(s.Shape) == 0 {
		return 1
	}
	return numElements(s.Shape[1:])
}

// Elems returns the unpadded number of elements of the parameter.
func (s Slot) Elems() int64 { return s.Rows() * s.RowElems() }

// PaddedElems returns the elements the parameter takes in the gathered
// buffer, padding included.
func (s Slot) PaddedElems() int64 { return s.PaddedRows * s.RowElems() }

// ShardElems returns the elements of the parameter in one rank's shard.
func (s Slot) ShardElems() int64 { return s.ShardRows * s.RowElems() }

// Layout returns the gathered layout of unit u for an FSDP mesh of dp
// ranks: u's parameters in Units() order, each padded to dp·ceil(rows/dp)
// rows. In a rank's shard they are contiguous in that order (ShardOffset;
// checkpoints store shards so). In the gathered buffer (Offset) they are
// contiguous in gatheredOrder, which puts a decoder layer's q, k and v
// weights next to each other (FusedQKV). For the head unit of a model with
// tied word embeddings the embedding weight is appended after the head's
// own parameters (with Tied set). A dp below 1 is treated as 1.
func (c *Config) Layout(u Unit, dp int) []Slot {
	d := int64(max(dp, 1))
	params := u.Params
	if u.Kind == UnitHead && c.TieWordEmbeddings {
		params = append(slices.Clone(params), Param{Name: EmbedWeightName, Shape: []int64{int64(c.VocabSize), int64(c.HiddenSize)}})
	}
	slots := make([]Slot, 0, len(params))
	var shardOff int64
	for _, p := range params {
		s := Slot{Name: p.Name, Shape: slices.Clone(p.Shape)}
		s.ShardRows = (s.Rows() + d - 1) / d
		s.PaddedRows = d * s.ShardRows
		s.Tied = u.Kind == UnitHead && p.Name == EmbedWeightName
		if !s.Tied {
			s.ShardOffset = shardOff
			shardOff += s.ShardElems()
		}
		slots = append(slots, s)
	}
	var off int64
	for _, k := range gatheredOrder(slots) {
		slots[k].Offset = off
		off += slots[k].PaddedElems()
	}
	return slots
}

// qkvSuffixes name a decoder layer's attention projection weights and
// biases, in the order FusedQKV needs them.
var qkvSuffixes = [2][3]string{
	{"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
	{"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"},
}

// isQKV reports whether name is a q, k or v projection weight (set 0) or
// bias (set 1).
func isQKV(name string, set int) bool {
	return slices.ContainsFunc(qkvSuffixes[set][:], func(sfx string) bool { return strings.HasSuffix(name, "."+sfx) })
}

// gatheredOrder returns the slots' indices in the order the gathered buffer
// holds them: their own, except that q, k and v biases come right after
// v_proj.weight (Qwen2 interleaves each bias with its weight), so that the
// three weights are adjacent and so are the three biases.
func gatheredOrder(slots []Slot) []int {
	isBias := func(name string) bool { return isQKV(name, 1) }
	var biases []int
	for k, s := range slots {
		if isBias(s.Name) {
			biases = append(biases, k)
		}
	}
	order := make([]int, 0, len(slots))
	for k, s := range slots {
		if isBias(s.Name) {
			continue
		}
		order = append(order, k)
		if strings.HasSuffix(s.Name, "."+qkvSuffixes[0][2]) {
			order = append(order, biases...)
			biases = nil
		}
	}
	return append(order, biases...) // biases without a v_proj stay last
}

// FusedQKV reports whether the decoder layer laid out by slots (from
// Layout) holds its q, k and v projection weights adjacent and unpadded in
// the gathered buffer, one [Hq·D+2·Hkv·D, H] matrix, and their biases (if
// any) likewise, so that one matrix product computes q, k and v (see
// LayerActs.QKV). Qwen3's per-head q/k norms keep the separate products.
func (c *Config) FusedQKV(slots []Slot) bool {
	if c.QKNorm {
		return false
	}
	for set, want := range []bool{true, c.AttentionBias} {
		if !want {
			continue
		}
		var next int64 = -1
		for _, sfx := range qkvSuffixes[set] {
			k := slices.IndexFunc(slots, func(s Slot) bool { return strings.HasSuffix(s.Name, "."+sfx) })
			if k < 0 {
				return false
			}
			s := slots[k]
			if s.PaddedRows != s.Rows() || (next >= 0 && s.Offset != next) {
				return false
			}
			next = s.Offset + s.Elems()
		}
	}
	return true
}

// FusedSpan returns the span [lo, hi) of the gathered buffer laid out by
// slots (from Layout) that holds a decoder layer's q, k and v projection
// weights and biases, which gatheredOrder puts next to each other for the
// fused projection (FusedQKV) where a rank's shard, in the parameters'
// own order, interleaves each bias with its weight. lo == hi when the
// layout has none of them.
func FusedSpan(slots []Slot) (lo, hi int64) {
	lo = -1
	for _, s := range slots {
		if !isQKV(s.Name, 0) && !isQKV(s.Name, 1) {
			continue
		}
		if lo < 0 || s.Offset < lo {
			lo = s.Offset
		}
		hi = max(hi, s.Offset+s.PaddedElems())
	}
	if lo < 0 {
		return 0, 0
	}
	return lo, hi
}

// LayoutElems returns the number of elements of a gathered buffer with the
// given layout, padding included.
func LayoutElems(slots []Slot) int64 {
	var n int64
	for _, s := range slots {
		n = max(n, s.Offset+s.PaddedElems())
	}
	return n
}

// LayoutShardElems returns the number of elements of one rank's shard of the
// unit with the given layout (tied slots, owned by another unit, excluded).
func LayoutShardElems(slots []Slot) int64 {
	var n int64
	for _, s := range slots {
		if !s.Tied {
			n += s.ShardElems()
		}
	}
	return n
}

// SlotView returns the unpadded view of slot s in the gathered buffer flat,
// shaped like the parameter. flat may have any shape; its elements are
// addressed in order.
func SlotView(s Slot, flat gpu.Tensor) (gpu.Tensor, error) {
	if flat.Mem == nil {
		return gpu.Tensor{}, fmt.Errorf("slot %s: gathered buffer is absent", s.Name)
	}
	if s.Offset < 0 || s.PaddedRows < s.Rows() || s.Offset+s.PaddedElems() > int64(flat.Numel()) {
		return gpu.Tensor{}, fmt.Errorf("slot %s (offset %d, %d padded rows) does not fit a gathered buffer of %d elements",
			s.Name, s.Offset, s.PaddedRows, flat.Numel())
	}
	all, err := flat.Reshape(-1)
	if err != nil {
		return gpu.Tensor{}, fmt.Errorf("slot %s: %w", s.Name, err)
	}
	v, err := all.Flat(int(s.Offset), int(s.Offset+s.Elems()))
	if err != nil {
		return gpu.Tensor{}, fmt.Errorf("slot %s: %w", s.Name, err)
	}
	shape := make([]int, len(s.Shape))
	for i, d := range s.Shape {
		shape[i] = int(d)
	}
	return v.Reshape(shape...)
}

// SlotSource returns the view of a unit's parameter laid out by slot s,
// shaped like the parameter: SlotView of a gathered buffer, or (on one
// rank) a view of the shard itself.
type SlotSource func(s Slot) (gpu.Tensor, error)

// Gathered is the SlotSource of gathered buffer flat.
func Gathered(flat gpu.Tensor) SlotSource {
	return func(s Slot) (gpu.Tensor, error) { return SlotView(s, flat) }
}

// slotViews checks slots against the layout of unit u (names and shapes,
// in order; the padding may be for any dp) and returns each parameter's
// view from src, keyed by name.
func (c *Config) slotViews(u Unit, slots []Slot, src SlotSource) (map[string]gpu.Tensor, error) {
	want := c.Layout(u, 1)
	if len(slots) != len(want) {
		return nil, fmt.Errorf("unit %s %d: layout has %d slots, want %d", u.Kind, u.Index, len(slots), len(want))
	}
	views := make(map[string]gpu.Tensor, len(slots))
	for i, s := range slots {
		if s.Name != want[i].Name || !slices.Equal(s.Shape, want[i].Shape) {
			return nil, fmt.Errorf("unit %s %d: slot %d is %s %v, want %s %v", u.Kind, u.Index, i, s.Name, s.Shape, want[i].Name, want[i].Shape)
		}
		v, err := src(s)
		if err != nil {
			return nil, err
		}
		views[s.Name] = v
	}
	return views, nil
}

// LayerWeights holds views of one decoder layer's parameters. Absent
// parameters (biases the config does not have, q/k norms outside Qwen3)
// are zero Tensors.
type LayerWeights struct {
	// InputNorm and PostNorm are the input_layernorm and
	// post_attention_layernorm weights, [H].
	InputNorm, PostNorm gpu.Tensor
	// Q, K, V and O are the attention projections: q_proj [Hq·D, H],
	// k_proj and v_proj [Hkv·D, H], o_proj [H, Hq·D].
	Q, K, V, O gpu.Tensor
	// QBias, KBias and VBias are the projection biases, [Hq·D] and [Hkv·D]
	// (Config.AttentionBias).
	QBias, KBias, VBias gpu.Tensor
	// OBias is the o_proj bias, [H] (Config.OutputBias).
	OBias gpu.Tensor
	// QNorm and KNorm are the per-head RMSNorm weights of Qwen3, [D].
	QNorm, KNorm gpu.Tensor
	// Gate, Up and Down are the MLP projections: gate_proj and up_proj
	// [I, H], down_proj [H, I].
	Gate, Up, Down gpu.Tensor
}

// LayerWeightsFrom returns views (unpadded) of decoder unit u's parameters
// in flat, a gathered buffer of LayoutElems(slots) elements laid out by
// slots (from Layout). The same call on a gradient buffer of the same
// layout gives the gradient views LayerBackward accumulates into.
func (c *Config) LayerWeightsFrom(u Unit, slots []Slot, flat gpu.Tensor) (LayerWeights, error) {
	return c.LayerWeightsOf(u, slots, Gathered(flat))
}

// LayerWeightsOf returns decoder unit u's parameters as src views them
// (see LayerWeightsFrom).
func (c *Config) LayerWeightsOf(u Unit, slots []Slot, src SlotSource) (LayerWeights, error) {
	if u.Kind != UnitDecoder {
		return LayerWeights{}, fmt.Errorf("layer weights: unit %s %d is not a decoder layer", u.Kind, u.Index)
	}
	views, err := c.slotViews(u, slots, src)
	if err != nil {
		return LayerWeights{}, err
	}
	pre := fmt.Sprintf("model.layers.%d.", u.Index)
	var w LayerWeights
	for name, v := range views {
		field, ok := strings.CutPrefix(name, pre)
		if !ok {
			return LayerWeights{}, fmt.Errorf("layer weights: parameter %s is not in layer %d", name, u.Index)
		}
		switch field {
		case "input_layernorm.weight":
			w.InputNorm = v
		case "post_attention_layernorm.weight":
			w.PostNorm = v
		case "self_attn.q_proj.weight":
			w.Q = v
		case "self_attn.k_proj.weight":
			w.K = v
		case "self_attn.v_proj.weight":
			w.V = v
		case "self_attn.o_proj.weight":
			w.O = v
		case "self_attn.q_proj.bias":
			w.QBias = v
		case "self_attn.k_proj.bias":
			w.KBias = v
		case "self_attn.v_proj.bias":
			w.VBias = v
		case "self_attn.o_proj.bias":
			w.OBias = v
		case "self_attn.q_norm.weight":
			w.QNorm = v
		case "self_attn.k_norm.weight":
			w.KNorm = v
		case "mlp.gate_proj.weight":
			w.Gate = v
		case "mlp.up_proj.weight":
			w.Up = v
		case "mlp.down_proj.weight":
			w.Down = v
		default:
			return LayerWeights{}, fmt.Errorf("layer weights: unknown parameter %s", name)
		}
	}
	return w, nil
}

// HeadWeights holds views of the head's parameters: the final norm [H] and
// the LM head [V, H] (the embedding weight for a tied model).
type HeadWeights struct {
	Norm, LMHead gpu.Tensor
}

// HeadWeightsFrom returns views of head unit u's parameters in flat, a
// gathered buffer laid out by slots (from Layout). For a tied model LMHead
// is the appended embedding slot.
func (c *Config) HeadWeightsFrom(u Unit, slots []Slot, flat gpu.Tensor) (HeadWeights, error) {
	return c.HeadWeightsOf(u, slots, Gathered(flat))
}

// HeadWeightsOf returns head unit u's parameters as src views them (see
// HeadWeightsFrom).
func (c *Config) HeadWeightsOf(u Unit, slots []Slot, src SlotSource) (HeadWeights, error) {
	if u.Kind != UnitHead {
		return HeadWeights{}, fmt.Errorf("head weights: unit %s %d is not the head", u.Kind, u.Index)
	}
	views, err := c.slotViews(u, slots, src)
	if err != nil {
		return HeadWeights{}, err
	}
	w := HeadWeights{Norm: views["model.norm.weight"], LMHead: views["lm_head.weight"]}
	if c.TieWordEmbeddings {
		w.LMHead = views[EmbedWeightName]
	}
	if w.Norm.Mem == nil || w.LMHead.Mem == nil {
		return HeadWeights{}, fmt.Errorf("head weights: layout lacks the norm or the LM head")
	}
	return w, nil
}
