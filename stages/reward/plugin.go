package reward

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
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
// to be a likely typo, or "".
func closest(name string, names []string) string {
	best, bestDist := "", -1
	for _, n := range names {
		d := editDistance(strings.ToLower(name), strings.ToLower(n))
		if bestDist < 0 || d < bestDist {
			best, bestDist = n, d
		}
	}
	if best == "" || bestDist > max(1, len([]rune(name))/3) {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b, in
// runes: the Levenshtein distance with the swap of two adjacent runes
// counted as one edit, the commonest typo.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	// d[i][j] is the distance between ra[:i] and rb[:j].
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
