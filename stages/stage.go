// Package stages holds the Stage interface, the registry of stage kinds
// (modelled on Caddy's modules: kinds register at init, their `with:` block is
// decoded strictly into the kind's parameter struct over its defaults, then
// validated against the job), the typed ports through which stages exchange
// data, the engine that plans and runs a job, and the standard kinds, one
// file each: load_hf, apply_fsdp2, pack, ref_logprob, actor_logprob, train
// and update_ref.
package stages

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/rlpipe/rlpipe/spec"
)

// Stage is one configured stage: the kind's parameter struct after decoding.
// Implementations are pointers to structs whose yaml tags name the keys of
// the stage's `with:` block.
type Stage interface {
	// Ports declares the data the stage reads and writes (see ports.go); it
	// may depend on the parameters and on the spec. An input named X takes
	// its producer from `with: {X: STAGE_ID}` when the stage accepts that
	// key, and is otherwise fed by the one stage that produces its type.
	Ports(s *spec.Spec) Ports
	// Validate checks the parameters against the job (models, the data
	// edges, other stages). It runs even when other parts of the job have
	// errors, so it must cope with missing models and graph nodes.
	Validate(vc *ValidateContext) spec.Errors
	// Plan declares the ops and buffers the stage allocates on each device.
	Plan(pc *PlanContext) error
	// Run executes the stage on one rank. Its ops and buffers must be the
	// ones Plan declared: the rank's arena checks them.
	Run(ctx context.Context, rc *RunContext) error
}

// Kind describes a registered stage kind.
type Kind struct {
	Name  string
	Phase spec.Phase // the phase the kind runs in
	Doc   string     // one line for `rlpipe stages`
	// New returns the kind's parameter struct with its defaults filled in.
	New func() Stage
}

var (
	mu    sync.RWMutex
	kinds = map[string]Kind{}
)

// Register adds a stage kind. It panics on a duplicate or malformed kind:
// registration happens at init time and is a programming error, not input.
func Register(k Kind) {
	mu.Lock()
	defer mu.Unlock()
	if k.Name == "" || k.New == nil {
		panic("stages: Register needs a name and a New function")
	}
	if _, dup := kinds[k.Name]; dup {
		panic(fmt.Sprintf("stages: kind %q registered twice", k.Name))
	}
	kinds[k.Name] = k
}

// Lookup returns the kind registered under name.
func Lookup(name string) (Kind, bool) {
	mu.RLock()
	defer mu.RUnlock()
	k, ok := kinds[name]
	return k, ok
}

// Kinds returns every registered kind sorted by name.
func Kinds() []Kind {
	mu.RLock()
	defer mu.RUnlock()
	out := make([]Kind, 0, len(kinds))
	for _, k := range kinds {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func kindNames() string {
	var names []string
	for _, k := range Kinds() {
		names = append(names, k.Name)
	}
	return strings.Join(names, ", ")
}

// Decode builds the Stage for one spec entry: it looks the kind up, decodes
// the entry's `with:` block strictly over the kind's defaults and checks that
// the entry sits in the kind's phase.
func Decode(st *spec.Stage) (Stage, spec.Errors) {
	k, ok := Lookup(st.Uses)
	if !ok {
		msg := fmt.Sprintf("unknown stage kind %q (known: %s)", st.Uses, kindNames())
		if s := closest(st.Uses, Kinds()); s != "" {
			msg = fmt.Sprintf("unknown stage kind %q (did you mean %q?)", st.Uses, s)
		}
		return nil, spec.Errors{spec.Errorf(st.UsesPos, "%s", msg)}
	}
	var errs spec.Errors
	if k.Phase != st.Phase {
		errs = append(errs, spec.Errorf(st.UsesPos, "stage kind %q runs in stages.%s, not stages.%s", k.Name, k.Phase, st.Phase))
	}
	s := k.New()
	if st.With != nil {
		errs = append(errs, spec.DecodeStrict(st.UsesPos.File, st.With, s)...)
	}
	return s, errs
}

func closest(name string, ks []Kind) string {
	names := make([]string, len(ks))
	for i, k := range ks {
		names[i] = k.Name
	}
	return spec.Closest(name, names)
}
