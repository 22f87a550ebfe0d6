package stages

import (
	"fmt"

	"github.com/rlpipe/rlpipe/runtime/plan"
)

// Device memory outside the arena. These are estimates of what the CUDA
// driver and libraries take on an H100 (context, module images, cuBLASLt
// handle) and what NCCL takes for its channels; the GPU tests check the
// NVML-measured process memory against arena + reserve.
const (
	CUDAContextReserve = 768 << 20
	NCCLReserve        = 512 << 20
	CUBLASWorkspace    = 32 << 20
)

// Plan builds the per-device memory plan of the job: every stage in order
// declares its ops and buffers, then the builder assigns arena offsets.
func Plan(j *Job) (*plan.Plan, error) {
	b := plan.NewBuilder()
	b.BeginStage("(runtime)", "runtime", "setup")
	op := b.Op("create context, cuBLAS handle")
	b.Persistent("cublas.workspace", plan.Workspace, CUBLASWorkspace, false, op)
	b.EndStage()
	b.AddReserve(plan.Reserve{Name: "cuda_context", Bytes: CUDAContextReserve, Note: "CUDA context, kernel images, cuBLASLt (estimate)"})
	if j.Spec.Mesh.WorldSize() > 1 {
		b.AddReserve(plan.Reserve{Name: "nccl", Bytes: NCCLReserve, Note: "NCCL channel buffers (estimate)"})
	}
	pc := &PlanContext{Job: j, B: b, Sharded: map[string]*ShardState{}, StepOutputs: map[string]*plan.Buffer{}}
	for _, st := range j.Order {
		s := j.Stages[st.ID]
		if s == nil {
			return nil, fmt.Errorf("stage %q was not resolved", st.ID)
		}
		pc.Stage = st
		b.BeginStage(st.ID, st.Uses, string(st.Phase))
		if err := s.Plan(pc); err != nil {
			return nil, fmt.Errorf("planning stage %q: %w", st.ID, err)
		}
		b.EndStage()
	}
	return b.Finish()
}
