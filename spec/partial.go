package spec

import (
	"math"
	"strings"
)

// Bad reports whether section, a top-level key of the spec ("version",
// "name", "models", "mesh", "data", "train", "policies" or "stages"), is
// bad in a partial spec: Parse reported an error inside it (or its absence),
// or it holds a value that Parse reset because of an error elsewhere, such
// as a data.global_batch_size that is not a multiple of the mesh.dp that
// replaced an invalid one. A consumer that checks a partial spec further can
// skip the checks of a bad section that would only repeat an error in other
// words. Bad is false for every section of a valid spec, and for names that
// are not sections.
func (s *Spec) Bad(section string) bool {
	return s != nil && s.bad[section]
}

// DroppedStages reports whether the partial spec lacks stages the file
// wrote, dropped for an invalid or duplicate id or an empty uses: a
// consumer checking the stage graph would then report inputs those stages
// would have fed.
func (s *Spec) DroppedStages() bool { return s != nil && s.droppedStages }

// sanitize turns s, decoded from a spec with errors, into the partial spec
// that Spec describes. It replaces every value that fails a check of the
// spec, or that f says a cross-field check reported, by the key's default
// (zero for a required key), and then every value that is inconsistent with
// a replaced one, in the order in which the checks depend on each other
// (mesh, data, train). The computed defaults of the keys f says are absent
// are computed from the sanitized values. sanitize is the identity on a
// valid spec, and on a spec it returned, with empty facts. It returns the
// sections whose values it changed.
func sanitize(s *Spec, f facts) map[string]bool {
	changed := map[string]bool{}
	if s.Version != Version {
		s.Version = 0
	}
	if !nameRE.MatchString(s.Name) {
		s.Name = ""
	}
	sanitizeModels(s, changed)

	m := &s.Mesh
	if !in(m.Nodes, 1, MaxNodes) {
		reset(changed, "mesh", &m.Nodes, 1)
	}
	if !in(m.GPUsPerNode, 1, MaxGPUsPerNode) {
		reset(changed, "mesh", &m.GPUsPerNode, 1)
	}
	if m.CP < 1 || m.CP > m.WorldSize() || m.WorldSize()%m.CP != 0 {
		reset(changed, "mesh", &m.CP, 1)
	}
	reset(changed, "mesh", &m.DP, m.WorldSize()/m.CP)
	if strings.TrimSpace(m.GPU) == "" {
		reset(changed, "mesh", &m.GPU, "")
	}

	x := &s.Data
	if strings.TrimSpace(x.Rollouts) == "" {
		reset(changed, "data", &x.Rollouts, "")
	}
	if strings.TrimSpace(x.Prompts) == "" {
		reset(changed, "data", &x.Prompts, "")
	}
	if !in(x.SamplesPerPrompt, 1, MaxSamplesPerPrompt) {
		reset(changed, "data", &x.SamplesPerPrompt, 1)
	}
	if f.failed["data.global_batch_size"] || !in(x.GlobalBatchSize, 1, MaxGlobalBatchSize) ||
		x.GlobalBatchSize%x.SamplesPerPrompt != 0 || x.GlobalBatchSize%m.DP != 0 {
		reset(changed, "data", &x.GlobalBatchSize, 0)
	}
	b := int64(x.RolloutBatchSize) * int64(x.SamplesPerPrompt)
	if f.defaultRollout || f.failed["data.rollout_batch_size"] || !in(x.RolloutBatchSize, 1, MaxRolloutSamples) || b > MaxRolloutSamples ||
		x.GlobalBatchSize != 0 && b%int64(x.GlobalBatchSize) != 0 {
		reset(changed, "data", &x.RolloutBatchSize, x.GlobalBatchSize/x.SamplesPerPrompt)
	}
	if !in(x.MaxTokensPerGPU, 1, MaxTokens) {
		reset(changed, "data", &x.MaxTokensPerGPU, 0)
	}
	if f.failed["data.max_seq_len"] || !in(x.MaxSeqLen, 1, MaxTokens) || x.MaxTokensPerGPU != 0 && SeqRows(x.MaxSeqLen, m.CP) > x.MaxTokensPerGPU {
		reset(changed, "data", &x.MaxSeqLen, min(MaxSeqFits(x.MaxTokensPerGPU, m.CP), MaxTokens))
	}
	if !positiveFinite(x.Temperature) {
		reset(changed, "data", &x.Temperature, 1)
	}

	t := &s.Train
	if !in(t.Steps, 1, MaxSteps) {
		reset(changed, "train", &t.Steps, 0)
	}
	if !in(t.PPOEpochs, 1, MaxPPOEpochs) {
		reset(changed, "train", &t.PPOEpochs, 1)
	}
	if f.failed["train.steps"] || s.TotalUpdates() > MaxUpdates {
		reset(changed, "train", &t.Steps, 0)
	}
	if t.ShuffleGroups && (f.failed["train.shuffle_groups"] || !t.Shuffle) {
		reset(changed, "train", &t.ShuffleGroups, false)
	}
	if t.Seed < 0 {
		reset(changed, "train", &t.Seed, 1)
	}
	if !positiveFinite(t.LR) {
		reset(changed, "train", &t.LR, 1e-6)
	}
	if f.failed["train.min_lr"] || !nonNegativeFinite(t.MinLR) || t.MinLR > t.LR {
		reset(changed, "train", &t.MinLR, 0)
	}
	for i, def := range [2]float64{0.9, 0.95} {
		if !(t.Betas[i] >= 0 && t.Betas[i] < 1) {
			reset(changed, "train", &t.Betas[i], def)
		}
	}
	if !positiveFinite(t.Eps) {
		reset(changed, "train", &t.Eps, 1e-8)
	}
	if !nonNegativeFinite(t.WeightDecay) {
		reset(changed, "train", &t.WeightDecay, 0)
	}
	if !nonNegativeFinite(t.GradClip) {
		reset(changed, "train", &t.GradClip, 1)
	}
	if f.failed["train.warmup_steps"] || !in(t.WarmupSteps, 0, MaxUpdates) {
		reset(changed, "train", &t.WarmupSteps, 0)
	}
	if f.failed["train.warmup_init_lr"] || !nonNegativeFinite(t.WarmupInitLR) || t.WarmupInitLR > t.LR {
		reset(changed, "train", &t.WarmupInitLR, 0)
	}
	if !contains(Decays, t.Decay) {
		reset(changed, "train", &t.Decay, "constant")
	}
	if f.defaultDecay || f.failed["train.decay_steps"] || !in(t.DecaySteps, 0, MaxUpdates) {
		reset(changed, "train", &t.DecaySteps, int(s.TotalUpdates()))
	}
	if t.Decay != "constant" && t.DecaySteps != 0 && t.DecaySteps <= t.WarmupSteps {
		// An explicit decay_steps is the value reported; the default
		// one reports warmup_steps.
		reset(changed, "train", &t.DecaySteps, int(s.TotalUpdates()))
		if t.DecaySteps != 0 && t.DecaySteps <= t.WarmupSteps {
			reset(changed, "train", &t.WarmupSteps, 0)
		}
	}
	if !in(t.CheckpointEvery, 0, MaxSteps) {
		reset(changed, "train", &t.CheckpointEvery, 0)
	}

	if p := s.Policies.Precision; p != nil {
		values, _ := p.StringResults()
		for _, v := range values {
			if !contains(Precisions, v) {
				s.Policies.Precision, changed["policies"] = nil, true
				break
			}
		}
	}
	sanitizeStages(s, changed)
	return changed
}

// sanitizeModels drops the models of s whose names are invalid or repeated,
// clears a role other than "actor" or "ref" and every "actor" role after the
// first, clears path and copy_of when both are set, and clears a copy_of that
// does not name another kept model that is not itself a copy.
func sanitizeModels(s *Spec, changed map[string]bool) {
	byName := map[string]*Model{}
	var kept []*Model
	for _, m := range s.Models {
		if !nameRE.MatchString(m.Name) || byName[m.Name] != nil {
			changed["models"] = true
			continue
		}
		byName[m.Name] = m
		kept = append(kept, m)
	}
	if len(kept) != len(s.Models) {
		s.Models = kept
	}
	// Decide on every copy_of before clearing any: a copy of a copy is
	// reported even when the source's own copy_of is invalid.
	var cleared []*Model
	for _, m := range kept {
		if m.CopyOf == "" {
			continue
		}
		if src := byName[m.CopyOf]; src == nil || src == m || src.CopyOf != "" || m.Path != "" {
			cleared = append(cleared, m)
		}
	}
	for _, m := range cleared {
		m.Path, m.CopyOf, changed["models"] = "", "", true
	}
	actor := false
	for _, m := range kept {
		switch {
		case m.Role == "actor" && !actor:
			actor = true
		case m.Role != "ref" && m.Role != "":
			m.Role, changed["models"] = "", true
		}
		if m.Path != "" && strings.TrimSpace(m.Path) == "" {
			m.Path, changed["models"] = "", true
		}
	}
}

// sanitizeStages drops the stages of s without a valid id or with a
// duplicate one (keeping the first) and those whose uses is empty, then
// drops the needs that name a dropped stage.
func sanitizeStages(s *Spec, changed map[string]bool) {
	seen, dropped := map[string]bool{}, map[string]bool{}
	keep := func(list []*Stage) []*Stage {
		var out []*Stage
		for _, st := range list {
			valid := stageIDRE.MatchString(st.ID) && !seen[st.ID]
			if valid {
				seen[st.ID] = true
			}
			if !valid || strings.TrimSpace(st.Uses) == "" {
				if st.ID != "" {
					dropped[st.ID] = true
				}
				changed["stages"], s.droppedStages = true, true
				continue
			}
			out = append(out, st)
		}
		if len(out) == len(list) {
			return list
		}
		return out
	}
	s.Setup, s.Step = keep(s.Setup), keep(s.Step)
	kept := map[string]bool{}
	for _, st := range append(append([]*Stage(nil), s.Setup...), s.Step...) {
		kept[st.ID] = true
	}
	for _, st := range append(append([]*Stage(nil), s.Setup...), s.Step...) {
		var needs []Ref
		for _, r := range st.Needs {
			if r.Name != "" && (kept[r.Name] || !dropped[r.Name]) {
				needs = append(needs, r)
			}
		}
		if len(needs) != len(st.Needs) {
			st.Needs, changed["stages"] = needs, true
		}
	}
}

// reset sets *field to v and, when that changes it, records the change of
// section in changed.
func reset[T comparable](changed map[string]bool, section string, field *T, v T) {
	if *field != v {
		*field, changed[section] = v, true
	}
}

// in reports whether lo <= v <= hi.
func in[T int | int64](v T, lo, hi int64) bool { return int64(v) >= lo && int64(v) <= hi }

// positiveFinite reports whether v is a finite number > 0.
func positiveFinite(v float64) bool { return v > 0 && !math.IsInf(v, 1) }

// nonNegativeFinite reports whether v is a finite number >= 0.
func nonNegativeFinite(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }
