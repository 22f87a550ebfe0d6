package stages

import (
	"fmt"
	"sort"

	"github.com/rlpipe/rlpipe/runtime/plan"
)

// writerBuffer is what a model.SafetensorsWriter holds besides the tensor
// it is given: its encoding chunk (4 × 2^22 bytes) and its 1 MiB write
// buffer.
const writerBuffer = 4<<22 + 1<<20

// hostBuffers lists the host (not pinned) buffers a rank's process needs
// outside the arena, each at its own time (loading needs none: it reads
// into the pinned staging buffer):
//
//   - checkpoint: SaveShards downloads one shard tensor at a time (the
//     largest unit's params, or its fp32 moments) into a float32 buffer;
//   - export: rank 0 assembles one full tensor of the exported model at a
//     time from the ranks' shard files.
func hostBuffers(j *Job) []plan.HostUse {
	dp := j.Spec.Mesh.WorldSize()
	var save, export int64
	var exportName string
	names := make([]string, 0, len(j.Stages))
	for id := range j.Stages {
		names = append(names, id)
	}
	sort.Strings(names)
	for _, id := range names {
		a, ok := j.Stages[id].(*ApplyFSDP2)
		if !ok {
			continue
		}
		m := j.Models[a.Model]
		if m == nil {
			continue
		}
		n := dp
		if w, err := j.shardWorld(a.Model); err == nil {
			n = w // 1 for a replica
		}
		var full int64
		for _, u := range Units(m, n) {
			save = max(save, 4*u.ShardElems)
			for _, s := range u.Slots {
				if !s.Tied {
					full = max(full, 4*s.Elems())
				}
			}
		}
		if m.Trainable && full > export {
			export, exportName = full, a.Model
		}
	}
	var out []plan.HostUse
	if save > 0 {
		out = append(out, plan.HostUse{Name: "checkpoint", Bytes: save + writerBuffer, Note: "the largest shard tensor, streamed"})
	}
	if export > 0 {
		out = append(out, plan.HostUse{Name: "export", Bytes: export + writerBuffer, Note: fmt.Sprintf("rank 0: the largest full tensor of %s, streamed", exportName), Rank0: true})
	}
	return out
}
