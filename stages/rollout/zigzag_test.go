package rollout

import (
	"fmt"
	"testing"
)

// TestCPShard splits a packed micro-batch over cp ranks and checks that
// every rank's rows carry the sample's tokens at their global positions,
// that padding rows are marked by positions past the sample's end, and
// that every response token is scored on exactly one rank, at the row
// holding its logit position.
func TestCPShard(t *testing.T) {
	var samples []Sample
	for j, n := range []int{9, 16, 3, 30} {
		s := Sample{ResponseLength: n / 2, Reward: 1}
		for i := range n {
			s.Tokens = append(s.Tokens, int32(100*j+i))
		}
		s.LossMask = make([]float32, s.ResponseLength)
		samples = append(samples, s)
	}
	p, err := Pack(samples, []int{0, 1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, cp := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("cp %d", cp), func(t *testing.T) {
			owner := make([]int, len(p.Targets))
			for k := range owner {
				owner[k] = -1
			}
			rows := 0
			for r := range cp {
				sh, err := p.CPShard(r, cp)
				if err != nil {
					t.Fatal(err)
				}
				rows += len(sh.Tokens)
				for i := range sh.Tokens {
					s, pos := sh.Layout.Global(i)
					n := int(p.CuSeqlens[s+1] - p.CuSeqlens[s])
					if int(sh.Positions[i]) != pos {
						t.Fatalf("rank %d row %d: position %d, want %d", r, i, sh.Positions[i], pos)
					}
					if pos < n && sh.Tokens[i] != p.Tokens[int(p.CuSeqlens[s])+pos] {
						t.Fatalf("rank %d row %d: token %d, want %d", r, i, sh.Tokens[i], p.Tokens[int(p.CuSeqlens[s])+pos])
					}
				}
				for x, k := range sh.Response {
					if owner[k] >= 0 {
						t.Fatalf("response token %d scored on ranks %d and %d", k, owner[k], r)
					}
					owner[k] = r
					s, pos := sh.Layout.Global(int(sh.LogitRows[x]))
					if g := p.CuSeqlens[s] + int32(pos); g != p.LogitPos[k] {
						t.Fatalf("rank %d: response token %d at packed row %d, its logits are at %d", r, k, g, p.LogitPos[k])
					}
					if x > 0 && sh.Response[x-1] >= k {
						t.Fatalf("rank %d: response order %v is not the packed order", r, sh.Response)
					}
				}
			}
			for k, r := range owner {
				if r < 0 {
					t.Fatalf("response token %d is scored on no rank", k)
				}
			}
			padded := 0
			for j := range p.NumSamples() {
				n := int(p.CuSeqlens[j+1] - p.CuSeqlens[j])
				padded += (n + 2*cp - 1) / (2 * cp) * 2 * cp
			}
			if rows != padded {
				t.Errorf("the ranks hold %d rows, want the padded %d", rows, padded)
			}
		})
	}
	if _, err := p.CPShard(2, 2); err == nil {
		t.Error("rank 2 of 2 accepted")
	}
}
