package rollout

import (
	"fmt"
	"math"
)

// Packed is one micro-batch laid out as a single flat token row with no
// padding. S is the number of packed samples and N = Σ R_i the number of
// response tokens.
//
// Sample j occupies packed positions [CuSeqlens[j], CuSeqlens[j+1]). Logits
// at packed position p predict the token at p+1, so response token t of
// sample j, at packed position end_j − R_j + t, is scored by the logits at
// position end_j − R_j + t − 1: the sample's response logits are the
// positions [end_j − 1 − R_j, end_j − 1). Since every sample has at least
// one prompt token, these positions never reach into the previous sample.
type Packed struct {
	// Tokens is the flat token row (length CuSeqlens[S]).
	Tokens []int32
	// Positions are the position ids, restarting at 0 for every sample.
	Positions []int32
	// CuSeqlens holds the S+1 cumulative sequence lengths, starting at 0.
	CuSeqlens []int32
	// MaxSeqlen is the length of the longest packed sample.
	MaxSeqlen int

	// LogitPos holds, for each of the N response tokens in sample order, the
	// packed position whose logits score it.
	LogitPos []int32
	// Targets holds the N response token ids (Tokens[LogitPos[k]+1]).
	Targets []int32
	// Mask holds the N loss-mask values.
	Mask []float32
	// RolloutLogProbs holds the N rollout log-probs, or nil when the samples
	// have none.
	RolloutLogProbs []float32
	// RespStart has S+1 entries: sample j's response tokens are entries
	// [RespStart[j], RespStart[j+1]) of LogitPos, Targets, Mask and
	// RolloutLogProbs.
	RespStart []int

	// SampleIndex is the index, in the slice given to Pack, of each packed
	// sample.
	SampleIndex []int
	// Rewards is the reward of each packed sample.
	Rewards []float64
}

// Pack lays out the samples idx (indices into samples, packed in the order
// given) as one flat row; see Packed. Every packed sample is validated (see
// Sample.Validate). An index out of range or repeated, an invalid sample,
// some samples with rollout log-probs and others without, or more than
// 2^31−1 tokens is an error. An empty idx gives an empty Packed.
func Pack(samples []Sample, idx []int) (*Packed, error) {
	var errs ErrorList
	seen := make(map[int]bool, len(idx))
	total, resp, withLP := 0, 0, 0
	for _, i := range idx {
		switch {
		case i < 0 || i >= len(samples):
			errs = append(errs, &LineError{Msg: fmt.Sprintf("sample %d is out of range (%d samples)", i, len(samples))})
			continue
		case seen[i]:
			errs = append(errs, &LineError{Msg: fmt.Sprintf("sample %d is listed twice", i)})
			continue
		}
		seen[i] = true
		s := &samples[i]
		if err := s.Validate(); err != nil {
			errs = append(errs, &LineError{Msg: err.Error()}) // err names the line
			continue
		}
		total += len(s.Tokens)
		resp += s.ResponseLength
		if s.RolloutLogProbs != nil {
			withLP++
		}
	}
	if withLP != 0 && withLP != len(idx) {
		errs = append(errs, &LineError{Msg: fmt.Sprintf("%d of %d samples have rollout_log_probs: give them for all or none", withLP, len(idx))})
	}
	if total > math.MaxInt32 {
		errs = append(errs, &LineError{Msg: fmt.Sprintf("%d tokens do not fit one packed row (at most %d)", total, math.MaxInt32)})
	}
	if err := errs.err(); err != nil {
		return nil, err
	}

	p := &Packed{
		Tokens:      make([]int32, 0, total),
		Positions:   make([]int32, 0, total),
		CuSeqlens:   make([]int32, 1, len(idx)+1),
		LogitPos:    make([]int32, 0, resp),
		Targets:     make([]int32, 0, resp),
		Mask:        make([]float32, 0, resp),
		RespStart:   make([]int, 1, len(idx)+1),
		SampleIndex: make([]int, 0, len(idx)),
		Rewards:     make([]float64, 0, len(idx)),
	}
	if withLP > 0 {
		p.RolloutLogProbs = make([]float32, 0, resp)
	}
	for _, i := range idx {
		s := &samples[i]
		p.Tokens = append(p.Tokens, s.Tokens...)
		for j := range s.Tokens {
			p.Positions = append(p.Positions, int32(j))
		}
		end := int32(len(p.Tokens))
		r := int32(s.ResponseLength)
		for t := range r {
			p.LogitPos = append(p.LogitPos, end-r+t-1)
		}
		p.Targets = append(p.Targets, s.Tokens[len(s.Tokens)-s.ResponseLength:]...)
		p.Mask = append(p.Mask, s.LossMask...)
		if p.RolloutLogProbs != nil {
			p.RolloutLogProbs = append(p.RolloutLogProbs, s.RolloutLogProbs...)
		}
		p.CuSeqlens = append(p.CuSeqlens, end)
		p.RespStart = append(p.RespStart, len(p.Targets))
		p.SampleIndex = append(p.SampleIndex, i)
		p.Rewards = append(p.Rewards, s.Reward)
		p.MaxSeqlen = max(p.MaxSeqlen, len(s.Tokens))
	}
	return p, nil
}

// NumSamples returns S, the number of packed samples.
func (p *Packed) NumSamples() int { return len(p.SampleIndex) }

// NumTokens returns the length of the packed row.
func (p *Packed) NumTokens() int { return len(p.Tokens) }

// Unpack splits values, one per response token in the order of Targets (for
// example log-probs computed at LogitPos), into one slice per packed sample.
// The slices alias values. A length other than len(Targets) is an error.
func (p *Packed) Unpack(values []float32) ([][]float32, error) {
	if len(values) != len(p.Targets) {
		return nil, fmt.Errorf("unpack: got %d values, want one per response token (%d)", len(values), len(p.Targets))
	}
	out := make([][]float32, p.NumSamples())
	for j := range out {
		out[j] = values[p.RespStart[j]:p.RespStart[j+1]:p.RespStart[j+1]]
	}
	return out, nil
}
