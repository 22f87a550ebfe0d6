package stages

import (
	"strings"
	"sync"
	"testing"

	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// TestAgreePlan checks agreePlan over a loopback of two ranks: plans of
// the same outline pass, whatever the reasons their choices quote; plans
// with another choice, or another arena, fail on both ranks, the rank that
// differs naming the difference.
func TestAgreePlan(t *testing.T) {
	base := func() *plan.Plan {
		return &plan.Plan{DeviceArena: 1 << 30, Auto: []plan.Choice{
			{Key: "gather_once", Subject: "model actor", Value: "true", Why: "... 40.00 of 79.18 GiB"},
		}}
	}
	tests := []struct {
		name  string
		edit  func(p *plan.Plan)
		want0 string // rank 0's error; "" none
		want1 string // rank 1's
	}{
		{"same", func(p *plan.Plan) { p.Auto[0].Why = "... 40.00 of 93.10 GiB" }, "", ""},
		{"another choice", func(p *plan.Plan) { p.Auto[0].Value = "false" },
			"rank 0: 1 rank(s) planned the job differently from rank 0",
			`rank 1 planned the job differently from rank 0 ("gather_once of model actor: false" here, "gather_once of model actor: true" on rank 0)`},
		{"another arena", func(p *plan.Plan) { p.DeviceArena++ },
			"rank 0: 1 rank(s) planned the job differently",
			`rank 1 planned the job differently from rank 0 ("arena: 1073741825 bytes`},
		{"a choice more", func(p *plan.Plan) {
			p.Auto = append(p.Auto, plan.Choice{Key: "chunk_tokens", Subject: "stage train", Value: "2048 rows"})
		},
			"rank 0: 1 rank(s) planned the job differently",
			`("chunk_tokens of stage train: 2048 rows" here, "arena: 1073741824 bytes, 0 resident, 0 buffers, 0 ops" on rank 0)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			comms := nccl.NewLoopback(2)
			defer comms[0].Close()
			plans := []*plan.Plan{base(), base()}
			tt.edit(plans[1])
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for r := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[r] = agreePlan(t.Context(), r, comms[r], plans[r])
				}()
			}
			wg.Wait()
			for r, want := range []string{tt.want0, tt.want1} {
				switch {
				case want == "" && errs[r] != nil:
					t.Errorf("rank %d: %v", r, errs[r])
				case want != "" && (errs[r] == nil || !strings.Contains(errs[r].Error(), want)):
					t.Errorf("rank %d: error %v, want one with %q", r, errs[r], want)
				}
			}
		})
	}
}
