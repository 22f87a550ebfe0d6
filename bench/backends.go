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

var (
	backendsMu sync.RWMutex
	backends   = map[string]NewBackend{
		"cpu": func(_, threads int) (gpu.Backend, error) { return cpu.NewWithThreads(threads), nil },
	}
)

// RegisterBackend makes a backend selectable by name (rlbench --backend).
// backend_cuda.go registers "cuda".
func RegisterBackend(name string, fn NewBackend) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	if _, dup := backends[name]; dup {
		panic(fmt.Sprintf("bench: backend %q registered twice", name))
	}
	backends[name] = fn
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

func lookupBackend(name string) (NewBackend, error) {
	backendsMu.RLock()
	defer backendsMu.RUnlock()
	fn, ok := backends[name]
	if !ok {
		return nil, fmt.Errorf("unknown backend %q; this binary has: %s", name, strings.Join(BackendNames(), ", "))
	}
	return fn, nil
}

// NewComms connects the ranks' backends (see stages.RunOptions.Comms).
type NewComms func(backends []gpu.Backend) ([]nccl.Comm, error)

var comms = map[string]NewComms{}

// RegisterComms sets the communicator of a GPU backend's ranks for dp > 1.
// backend_cuda.go registers NCCL for "cuda".
func RegisterComms(name string, fn NewComms) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	comms[name] = fn
}

func lookupComms(name string) NewComms {
	backendsMu.RLock()
	defer backendsMu.RUnlock()
	return comms[name]
}
