package enginetest

import (
	"slices"

	"github.com/rlpipe/rlpipe/stages/engines"
)

// Sampler produces n responses to a prompt (deterministic, for tests). The
// servers pass it the sampling parameters they received, the request's seed
// as Seed (0 where none was sent) and TopK 0 where the request turned top-k
// off. Tokens are sent as the sampler returns them; a nil LogProbs is sent
// as -1 per token, and an empty Finish as "length" where the response has
// MaxNewTokens tokens and "stop" otherwise.
type Sampler func(prompt []int32, n int, p engines.Params) []engines.Response

// Counting is the default sampler. Response j to a prompt counts up from
// (the sum of the prompt + Seed + 17*j) mod 1000 + 1, one token per step,
// with log-prob -(k mod 8 + 1)/8 for token k, until MaxNewTokens tokens
// ("length") or a token of StopTokenIDs, kept, unless IgnoreEOS ("stop").
func Counting(prompt []int32, n int, p engines.Params) []engines.Response {
	var sum int64
	for _, t := range prompt {
		sum += int64(t)
	}
	out := make([]engines.Response, n)
	for j := range out {
		start := ((sum+p.Seed+17*int64(j))%1000+1000)%1000 + 1
		r := engines.Response{Finish: engines.FinishLength}
		for k := range p.MaxNewTokens {
			tok := int32(start) + int32(k)
			r.Tokens = append(r.Tokens, tok)
			r.LogProbs = append(r.LogProbs, -float32(k%8+1)/8)
			if !p.IgnoreEOS && slices.Contains(p.StopTokenIDs, int(tok)) {
				r.Finish = engines.FinishStop
				break
			}
		}
		out[j] = r
	}
	return out
}

// SmallVocab is a sampler for models with a vocabulary of at least 251
// tokens (the repo's tiny model has 256) that ignores the seed, so that a
// test can recompute what it answered and two runs see the same
// responses: response j to a prompt with token sum S has
// min(4 + (S+j) mod 13, MaxNewTokens) tokens, token t being
// (7S + 31j + 13t) mod 250 + 1 with log-prob −0.1·(t mod 5 + 1); it
// finishes "length" when it has MaxNewTokens tokens, "stop" otherwise.
func SmallVocab(prompt []int32, n int, p engines.Params) []engines.Response {
	sum := 0
	for _, t := range prompt {
		sum += int(t)
	}
	out := make([]engines.Response, n)
	for j := range out {
		l := min(4+(sum+j)%13, p.MaxNewTokens)
		r := engines.Response{Finish: engines.FinishStop}
		if l == p.MaxNewTokens {
			r.Finish = engines.FinishLength
		}
		for t := range l {
			r.Tokens = append(r.Tokens, int32((sum*7+j*31+t*13)%250+1))
			r.LogProbs = append(r.LogProbs, -0.1*float32(t%5+1))
		}
		out[j] = r
	}
	return out
}
