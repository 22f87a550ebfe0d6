package engines

import (
	"fmt"
	"math"
)

// checkGenerate checks the arguments of a Generate call.
func checkGenerate(engine string, prompts [][]int32, n int, p Params) error {
	switch {
	case n < 1:
		return fmt.Errorf("%s generate: n must be at least 1, got %d", engine, n)
	case p.MaxNewTokens < 1:
		return fmt.Errorf("%s generate: max_new_tokens must be at least 1, got %d", engine, p.MaxNewTokens)
	case !(p.Temperature >= 0) || math.IsInf(p.Temperature, 0):
		return fmt.Errorf("%s generate: temperature must be finite and at least 0, got %v", engine, p.Temperature)
	case !(p.TopP >= 0 && p.TopP <= 1):
		return fmt.Errorf("%s generate: top_p must be in (0, 1] (0: 1), got %v", engine, p.TopP)
	case p.TopK < 0:
		return fmt.Errorf("%s generate: top_k must be at least 0 (0: off), got %d", engine, p.TopK)
	}
	for _, id := range p.StopTokenIDs {
		if id < 0 || id > math.MaxInt32 {
			return fmt.Errorf("%s generate: stop token id %d is out of range", engine, id)
		}
	}
	for i, pr := range prompts {
		if len(pr) == 0 {
			return fmt.Errorf("%s generate: prompt %d is empty", engine, i)
		}
	}
	return nil
}

// topP returns the top_p to send: 0 is taken as 1 (off).
func (p *Params) topP() float64 {
	if p.TopP == 0 {
		return 1
	}
	return p.TopP
}

// seed returns the seed of request i, or nil where Seed is 0.
func (p *Params) seed(i int) *int64 {
	if p.Seed == 0 {
		return nil
	}
	s := p.Seed + int64(i)
	return &s
}

// newResults returns the [prompt][sample] result of a Generate call.
func newResults(prompts, n int) [][]Response {
	out := make([][]Response, prompts)
	flat := make([]Response, prompts*n)
	for i := range out {
		out[i] = flat[i*n : (i+1)*n : (i+1)*n]
	}
	return out
}

// tokenID checks that a token id fits an int32 and is not negative.
func tokenID(v int64) (int32, error) {
	if v < 0 || v > math.MaxInt32 {
		return 0, fmt.Errorf("token id %d is out of range", v)
	}
	return int32(v), nil
}
