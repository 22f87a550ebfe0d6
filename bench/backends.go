package bench

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/nccl"
)

// NewBackend creates the backend of one rank. device is the GPU index the
// rank runs on (ignored by the CPU backend); threads is the CPU backend's
// worker count (0: all cores).
type NewBackend func(device, threads int) (gpu.Backend, error)

// NewComms connects the ranks' backends for dp > 1 (see
// stages.RunOptions.Comms).
type NewComms func(backends []gpu.Backend) ([]nccl.Comm, error)

// registered is a backend and the communicator of its ranks (nil: the
// engine's loopback, for host memory).
type registered struct {
	new   NewBackend
	comms NewComms
}

var (
	backendsMu sync.RWMutex
	backends   = map[string]registered{
		"cpu": {new: func(_, threads int) (gpu.Backend, error) { return cpu.NewWithThreads(threads), nil }},
	}
)

// RegisterBackend makes a backend selectable by name (rlbench --backend),
// with the communicator its ranks use when dp > 1. backend_cuda.go
// registers "cuda" with NCCL.
func RegisterBackend(name string, fn NewBackend, comms NewComms) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	if _, dup := backends[name]; dup {
		panic(fmt.Sprintf("bench: backend %q registered twice", name))
	}
	backends[name] = registered{new: fn, comms: comms}
}

// BackendNames lists the backends compiled into this binary.
func BackendNames() []string {
	backendsMu.RLock()
	defer backendsMu.RUnlock()
	names := make([]string, 0, len(backends))
	for n := range backends {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func lookupBackend(name string) (registered, error) {
	backendsMu.RLock()
	defer backendsMu.RUnlock()
	r, ok := backends[name]
	if !ok {
		return r, fmt.Errorf("unknown backend %q; this binary has: %s", name, strings.Join(BackendNames(), ", "))
	}
	return r, nil
}
