package plan

// HostUse is a host-memory (Go heap, not pinned) buffer a rank's process
// needs outside the arena: loading, checkpointing, exporting. They are
// used at different times (setup, the end of a step, the end of the run),
// so a process needs the largest, not their sum.
type HostUse struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
	Note  string `json:"note"`
	// Rank0 marks a buffer only rank 0 needs (the export).
	Rank0 bool `json:"rank0,omitempty"`
}

// HostBuffersPeak is the largest of the plan's host buffers on rank 0
// (rank0) or on the other ranks.
func (p *Plan) HostBuffersPeak(rank0 bool) int64 {
	var most int64
	for _, h := range p.HostBuffers {
		if rank0 || !h.Rank0 {
			most = max(most, h.Bytes)
		}
	}
	return most
}

// HostPerNode is what the processes of a node of ranksPerHost ranks need
// of host memory: every rank's pinned arena, largest host buffer (rank
// 0's among them) and process estimate.
func (p *Plan) HostPerNode(ranksPerHost int) int64 {
	n := int64(max(ranksPerHost, 1))
	return n*(p.HostArena+p.HostBuffersPeak(false)+p.HostProcess) + p.HostBuffersPeak(true) - p.HostBuffersPeak(false)
}

// FitsHost reports whether a node of ranksPerHost ranks fits in ram bytes.
func (p *Plan) FitsHost(ranksPerHost int, ram int64) bool { return p.HostPerNode(ranksPerHost) <= ram }
