package rollout

import (
	"fmt"

	"github.com/rlpipe/rlpipe/model"
)

// CPShard is one context-parallel rank's part of a packed micro-batch: its
// rows in zigzag order (model.ZigzagLayout: every sample padded to a
// multiple of 2·cp and cut into 2·cp chunks, rank r holding chunks r and
// 2·cp−1−r), and the response tokens whose logits fall in those rows. The
// response tokens of a micro-batch are split over the ranks, each held by
// exactly one, so the ranks' log-probs, scattered by Response into one
// array of len(Packed.Targets), give the micro-batch's.
type CPShard struct {
	Layout model.ZigzagLayout
	// Tokens holds the rank's rows; padding rows hold token 0.
	Tokens []int32
	// Positions holds each row's position in its sample (RoPE angles);
	// padding rows continue the count past the sample's end.
	Positions []int32
	// CuSeqlens holds the local row offsets of the samples (the layout's).
	CuSeqlens []int32
	// LogitRows holds the local rows whose logits score a response token,
	// and Response the index of that token in Packed.Targets (and Mask,
	// RolloutLogProbs), in the order of the packed row.
	LogitRows []int32
	Response  []int32
}

// CPShard returns rank's part of the micro-batch split over cp ranks.
func (p *Packed) CPShard(rank, cp int) (*CPShard, error) {
	lengths := make([]int, p.NumSamples())
	for j := range lengths {
		lengths[j] = int(p.CuSeqlens[j+1] - p.CuSeqlens[j])
	}
	z, err := model.NewZigzagLayout(rank, cp, lengths)
	if err != nil {
		return nil, fmt.Errorf("cp shard: %w", err)
	}
	rows := z.Rows()
	sh := &CPShard{Layout: z, Tokens: make([]int32, rows), Positions: make([]int32, rows), CuSeqlens: z.CuSeqlens()}
	// resp maps a packed logit position to its response index.
	resp := make(map[int32]int32, len(p.LogitPos))
	for k, pos := range p.LogitPos {
		resp[pos] = int32(k)
	}
	for i := range rows {
		s, pos := z.Global(i)
		sh.Positions[i] = int32(pos)
		if pos >= lengths[s] {
			continue // padding
		}
		g := p.CuSeqlens[s] + int32(pos)
		sh.Tokens[i] = p.Tokens[g]
		if k, ok := resp[g]; ok {
			sh.LogitRows = append(sh.LogitRows, int32(i))
			sh.Response = append(sh.Response, k)
		}
	}
	return sh, nil
}
