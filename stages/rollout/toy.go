package rollout

import (
	"fmt"
	"math/rand/v2"
)

// Toy generates a deterministic synthetic rollout for demos and tests:
// prompts groups of samplesPerPrompt samples, each with promptLen prompt
// tokens (shared within a group) and respLen response tokens, ids in
// [0, vocab).
//
// Every response is drawn with its own preference p ~ U(0, 1) for "low"
// tokens (ids below vocab/4): each response token is low with probability p,
// so rewards spread over [0, 1] and vary within a group. The reward is
// ToyReward(response, vocab), the fraction of low response tokens. GRPO on
// these fixed rollouts therefore raises the likelihood of low tokens, which
// is visible on any model. Loss masks are all ones; there are no rollout
// log-probs. The same arguments always give the same samples (the generator
// is a PCG seeded from seed).
func Toy(seed int64, prompts, samplesPerPrompt, promptLen, respLen, vocab int) ([]Sample, error) {
	switch {
	case prompts <= 0 || samplesPerPrompt <= 0:
		return nil, fmt.Errorf("toy: prompts (%d) and samples per prompt (%d) must be positive", prompts, samplesPerPrompt)
	case promptLen <= 0 || respLen <= 0:
		return nil, fmt.Errorf("toy: prompt length (%d) and response length (%d) must be positive", promptLen, respLen)
	case vocab < 4 || vocab > MaxTokenID:
		return nil, fmt.Errorf("toy: vocab %d must be in [4, %d]", vocab, MaxTokenID)
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))
	low := vocab / 4
	out := make([]Sample, 0, prompts*samplesPerPrompt)
	for g := range prompts {
		prompt := make([]int32, promptLen)
		for i := range prompt {
			prompt[i] = int32(rng.IntN(vocab))
		}
		for range samplesPerPrompt {
			p := rng.Float64()
			tokens := make([]int32, promptLen+respLen)
			copy(tokens, prompt)
			for i := promptLen; i < len(tokens); i++ {
				if rng.Float64() < p {
					tokens[i] = int32(rng.IntN(low))
				} else {
					tokens[i] = int32(low + rng.IntN(vocab-low))
				}
			}
			mask := make([]float32, respLen)
			for i := range mask {
				mask[i] = 1
			}
			out = append(out, Sample{
				Tokens:         tokens,
				ResponseLength: respLen,
				Reward:         ToyReward(tokens[promptLen:], vocab),
				LossMask:       mask,
				Group:          g,
				Index:          len(out),
			})
		}
	}
	return out, nil
}

// ToyReward is the reward rule of Toy: the fraction of response tokens whose
// id is below vocab/4. It is 0 for an empty response.
func ToyReward(response []int32, vocab int) float64 {
	if len(response) == 0 {
		return 0
	}
	n := 0
	for _, t := range response {
		if int(t) < vocab/4 {
			n++
		}
	}
	return float64(n) / float64(len(response))
}
