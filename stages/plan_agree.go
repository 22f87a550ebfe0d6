package stages

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/runtime/plan"
)

// When the ranks of a job run in several processes, each process plans
// the job itself. Plans that differ make ranks issue different
// collectives: gather_once left to auto, for one, decides how many
// all-gathers an update makes, so a rank that took it and one that did
// not would wait on each other for ever. Their GPU memory, read from
// NVML on each host, is what would set them apart (a card with ECC off
// reports more). So before anything runs every rank compares its plan's
// outline with rank 0's, and all of them fail if one differs.

// planOutline is what every rank's plan must share: the choices planning
// made where the spec said auto, and the arena's layout. It leaves out
// why a choice was made, which quotes the GPU's budget.
func planOutline(p *plan.Plan) string {
	var b strings.Builder
	for _, c := range p.Auto {
		fmt.Fprintf(&b, "%s of %s: %s\n", c.Key, c.Subject, c.Value)
	}
	fmt.Fprintf(&b, "arena: %d bytes, %d resident, %d buffers, %d ops\n", p.DeviceArena, p.ResidentArena, len(p.Buffers), len(p.Ops))
	return b.String()
}

// agreePlan checks that this rank's plan p has rank 0's outline, over
// control, a host-memory communicator of every rank: rank 0 broadcasts
// its outline, and a flag summed over the ranks says whether any differs,
// so that every rank fails, each with what it knows.
func agreePlan(ctx context.Context, id int, control nccl.Comm, p *plan.Plan) error {
	mine := planOutline(p)
	theirs, err := nccl.BroadcastBytes(ctx, control, 0, []byte(mine))
	if err != nil {
		return fmt.Errorf("rank %d: comparing its plan with rank 0's: %w", id, err)
	}
	flag := make(nccl.Bytes, 4)
	if string(theirs) != mine {
		binary.LittleEndian.PutUint32(flag, 1)
	}
	if err := control.AllReduce(ctx, gpu.Tensor{Mem: flag, DType: gpu.I32, Shape: []int{1}}, nccl.Sum); err != nil {
		return fmt.Errorf("rank %d: comparing its plan with rank 0's: %w", id, err)
	}
	differ := int32(binary.LittleEndian.Uint32(flag))
	switch {
	case differ == 0:
		return nil
	case string(theirs) == mine:
		return fmt.Errorf("rank %d: %d rank(s) planned the job differently from rank 0; every process must plan for the same GPU memory: set mesh.gpu, or pass every process the same --gpu", id, differ)
	}
	return fmt.Errorf("rank %d planned the job differently from rank 0 (%s); every process must plan for the same GPU memory: set mesh.gpu, or pass every process the same --gpu", id, firstDifference(mine, string(theirs)))
}

// firstDifference names the first line in which outline a (this rank's)
// and b (rank 0's) differ.
func firstDifference(a, b string) string {
	la, lb := strings.Split(strings.TrimSuffix(a, "\n"), "\n"), strings.Split(strings.TrimSuffix(b, "\n"), "\n")
	for i := range max(len(la), len(lb)) {
		x, y := "nothing", "nothing"
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			return fmt.Sprintf("%q here, %q on rank 0", x, y)
		}
	}
	return "the same lines"
}
