package stages

import (
	"fmt"

	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/rollout"
)

// RolloutBatch is the value of a TypeRollouts port: the samples one
// training step consumes (rollout_batch_size prompt groups of
// samples_per_prompt samples), in rollout order.
type RolloutBatch struct {
	Samples []rollout.Sample
}

// PromptBatch is the value of a TypePrompts port: the prompts of one
// training step (rollout_batch_size of them), each to be answered
// samples_per_prompt times.
type PromptBatch struct {
	Prompts []rollout.Prompt
}

// Batch is the value of a TypeBatch port: a rollout batch prepared for the
// model. A sample's batch index is its index in Samples; per-token values of
// the batch (TokenValues) hold sample k's response tokens at
// [RespOff[k], RespOff[k+1]).
type Batch struct {
	Samples []rollout.Sample
	// Advantages holds r̂ by batch index, computed over the whole batch.
	Advantages []float64
	// RespOff has len(Samples)+1 entries.
	RespOff []int
	// Tokens is the micro-batch token budget: no packed micro-batch of this
	// batch, on any rank, holds more tokens.
	Tokens int
	// Micro holds this rank's micro-batches of the whole batch, the batch
	// balanced over the dp ranks by tokens; Packed.SampleIndex holds batch
	// indices. While planning it is nil.
	Micro []*rollout.Packed
}

// NewBatch returns a batch of samples with its response offsets.
func NewBatch(samples []rollout.Sample, tokens int) *Batch {
	b := &Batch{Samples: samples, Tokens: tokens, RespOff: make([]int, len(samples)+1)}
	for k := range samples {
		b.RespOff[k+1] = b.RespOff[k] + samples[k].ResponseLength
	}
	return b
}

// RespTokens is the number of response tokens of the batch.
func (b *Batch) RespTokens() int { return b.RespOff[len(b.RespOff)-1] }

// Lengths returns every sample's token count, by batch index.
func (b *Batch) Lengths() []int { return rollout.Lengths(b.Samples) }

// Rows returns the rows every sample puts on each rank of a cp group
// (spec.SeqRows), by batch index: what the micro-batch budget counts.
func (b *Batch) Rows(cp int) []int {
	rows := b.Lengths()
	for i, n := range rows {
		rows[i] = spec.SeqRows(n, cp)
	}
	return rows
}

// Pack packs the samples idx (batch indices) into a micro-batch.
func (b *Batch) Pack(idx []int) (*rollout.Packed, error) { return rollout.Pack(b.Samples, idx) }

// TokenValues is the value of a per-token port (log-probs, entropies): one
// value per response token of every sample of a batch, sample k's at
// [Batch.RespOff[k], Batch.RespOff[k+1]).
type TokenValues struct {
	Values []float32
}

// Gather returns the values of the samples of micro-batch mb, in the
// micro-batch's token order (Packed.Targets).
func (v *TokenValues) Gather(b *Batch, mb *rollout.Packed) ([]float32, error) {
	if len(v.Values) != b.RespTokens() {
		return nil, fmt.Errorf("%d per-token values for a batch of %d response tokens", len(v.Values), b.RespTokens())
	}
	out := make([]float32, 0, len(mb.Targets))
	for _, k := range mb.SampleIndex {
		out = append(out, v.Values[b.RespOff[k]:b.RespOff[k+1]]...)
	}
	return out, nil
}
