//go:build cgo

package libnccl

/*
#include "rlnccl.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/rlpipe/rlpipe/nccl"
)

// noSplit, when set (by tests), makes Split take the path of an NCCL
// without ncclCommSplit.
var noSplit bool

// Split returns this process's rank of the NCCL communicator of its group
// within parent, a communicator of NewRank: the ranks of parent that pass
// the same color, context parallelism's cp group of a process per rank
// (color the dp rank). Every rank of parent must call it. host is a
// host-memory communicator over exactly the group's ranks, in the group's
// order (nccl.Split of the control communicator, with the same color and
// the group rank as key); the result's rank is host's. It carries the host
// side of Barrier, and the result owns it: closing the result closes host.
//
// With NCCL 2.18 or later, the group's communicators are split from
// parent's (ncclCommSplit, one for each of parent's streams, keyed by
// host's rank); before, they are bootstrapped anew over host, as NewRank
// does. The group is aborted when parent is, and when host fails, so
// that no collective of the group waits for ever on a rank that is gone.
// On an error host stays open.
func Split(ctx context.Context, parent nccl.Comm, host nccl.Comm, color int) (nccl.Comm, error) {
	p, ok := parent.(*cudaComm)
	switch {
	case !ok:
		return nil, fmt.Errorf("nccl: split: parent %T is not an NCCL communicator", parent)
	case len(p.g.main) != 1:
		return nil, fmt.Errorf("nccl: split: the parent has %d ranks in this process; split a communicator of NewRank (one)", len(p.g.main))
	case color < 0 || color > math.MaxInt32:
		return nil, fmt.Errorf("nccl: split: color %d outside [0,2³¹)", color)
	case p.g.isAborted():
		return nil, errors.New("nccl: split: the parent communicator was aborted")
	}
	if noSplit || !hasSplit() {
		c, err := NewRank(ctx, p.b, host)
		if err != nil {
			return nil, err
		}
		cc := c.(*cudaComm)
		cc.g.mu.Lock()
		cc.g.ownsHost = true
		cc.g.mu.Unlock()
		p.g.adopt(cc.g)
		return cc, nil
	}
	rank, n := host.Rank(), host.Size()
	g := &cudaGroup{n: n, host: []nccl.Comm{host}, main: []uintptr{0}, side: []uintptr{0}}
	// ncclCommSplit blocks until every rank of parent has called it; like
	// parent's collectives it runs on the rank's device thread.
	err := p.b.Enqueue(func(uintptr) error {
		for i, set := range [][]uintptr{g.main, g.side} {
			from := []uintptr{p.g.main[0], p.g.side[0]}[i]
			var c C.uintptr_t
			if err := ncclErr("ncclCommSplit", C.rl_nccl_comm_split_(C.uintptr_t(from), C.int(color), C.int(rank), &c)); err != nil {
				return err
			}
			set[0] = uintptr(c)
		}
		return nil
	})
	if err == nil {
		err = p.b.Sync()
	}
	if err != nil {
		g.abort()
		return nil, fmt.Errorf("nccl: rank %d of group %d: %w", rank, color, err)
	}
	g.ownsHost = true
	g.follow(host)
	p.g.adopt(g)
	return &cudaComm{g: g, rank: rank, slot: 0, b: p.b}, nil
}

// hasSplit says whether the loaded libnccl has ncclCommSplit.
func hasSplit() bool { return C.rl_nccl_has_split_() != 0 }

// adopt makes child abort with g (at once if g already has).
func (g *cudaGroup) adopt(child *cudaGroup) {
	g.mu.Lock()
	if !g.aborted {
		g.children = append(g.children, child)
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	child.abort()
}
