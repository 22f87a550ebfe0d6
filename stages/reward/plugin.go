package reward

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/rlpipe/rlpipe/spec"
)

var (
	pluginsMu sync.RWMutex
	plugins   = map[string]Scorer{}
)

// Register adds a Go reward under name (called from init functions of plugin
// packages). It panics on an empty name, a nil scorer or a duplicate, like
// stages.Register.
func Register(name string, s Scorer) {
	pluginsMu.Lock()
	defer pluginsMu.Unlock()
	if name == "" || s == nil {
		panic("reward: Register needs a name and a scorer")
	}
	if _, dup := plugins[name]; dup {
		panic(fmt.Sprintf("reward: plugin %q registered twice", name))
	}
	plugins[name] = s
}

// Plugins returns the names of the registered rewards, sorted.
func Plugins() []string {
	pluginsMu.RLock()
	defer pluginsMu.RUnlock()
	names := make([]string, 0, len(plugins))
	for name := range plugins {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// lookupPlugin returns the registered reward name, checked by pluginScorer.
func lookupPlugin(name string) (Scorer, error) {
	pluginsMu.RLock()
	s, ok := plugins[name]
	pluginsMu.RUnlock()
	if ok {
		return &pluginScorer{name: name, s: s}, nil
	}
	names := Plugins()
	msg := fmt.Sprintf("unknown reward plugin %q", name)
	switch near := closest(name, names); {
	case near != "":
		msg += fmt.Sprintf(" (did you mean %q?)", near)
	case len(names) == 0:
		msg += " (no reward plugins are registered: is the plugin package imported?)"
	default:
		msg += fmt.Sprintf(" (registered: %s)", strings.Join(names, ", "))
	}
	return nil, &ConfigError{Field: "plugin", Err: fmt.Errorf("%s", msg)}
}

// pluginScorer holds a plugin to the Scorer contract: one finite reward per
// sample.
type pluginScorer struct {
	name string
	s    Scorer
}

// Score implements Scorer.
func (p *pluginScorer) Score(ctx context.Context, samples []Sample) ([]float64, error) {
	rewards, err := p.s.Score(ctx, samples)
	if err != nil {
		return nil, fmt.Errorf("reward plugin %q: %w", p.name, err)
	}
	if len(rewards) != len(samples) {
		return nil, fmt.Errorf("reward plugin %q: returned %d rewards for %d samples", p.name, len(rewards), len(samples))
	}
	for i, r := range rewards {
		if err := checkFinite(r); err != nil {
			return nil, fmt.Errorf("reward plugin %q: sample %d: %w", p.name, samples[i].Index, err)
		}
	}
	return rewards, nil
}

// closest returns the name in names nearest to name when it is close enough
// to be a likely typo, or "": the spec's suggestion rule.
func closest(name string, names []string) string { return spec.Closest(name, names) }
