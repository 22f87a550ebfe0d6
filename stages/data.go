package stages

import (
	"errors"
	"fmt"
	"os"

	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/rollout"
)

// Data is the job's rollout file, read and checked: the source of the
// TypeRollouts input when no stage produces rollouts.
type Data struct {
	Samples []rollout.Sample
	// Batches holds the sample indices of each rollout batch, in file
	// order: step s consumes batch (s−1) mod len(Batches).
	Batches [][]int
}

// Step returns the rollout batch of training step step (1-based).
func (d *Data) Step(step int) *RolloutBatch {
	idx := d.Batches[(step-1)%len(d.Batches)]
	rb := &RolloutBatch{Samples: make([]rollout.Sample, len(idx))}
	for k, i := range idx {
		rb.Samples[k] = d.Samples[i]
	}
	return rb
}

// maxDataErrors is how many problems of the rollout file are reported one
// by one; the rest are counted.
const maxDataErrors = 20

// PromptData is the job's prompts file, read and checked: the source of
// the TypePrompts input.
type PromptData struct {
	Prompts []rollout.Prompt
	// PerStep is the number of prompts a step takes: rollout_batch_size.
	PerStep int
}

// Step returns the prompts of training step step (1-based): the next
// PerStep prompts of the file in order, wrapping around at its end, so
// every prompt is used once per pass over the file.
func (d *PromptData) Step(step int) *PromptBatch {
	pb := &PromptBatch{Prompts: make([]rollout.Prompt, d.PerStep)}
	start := (step - 1) * d.PerStep
	for k := range pb.Prompts {
		pb.Prompts[k] = d.Prompts[(start+k)%len(d.Prompts)]
	}
	return pb
}

// reads reports whether a stage of the graph reads the source src (the
// rollout or prompts file, at path). Without a graph (its errors are
// reported) it assumes so when the file is set.
func (j *Job) reads(src, path string) bool {
	if j.Graph == nil {
		return path != ""
	}
	for _, e := range j.Graph.Edges() {
		if e.From == nil && e.Source == src {
			return true
		}
	}
	return false
}

// readPrompts reads data.prompts when a stage reads it and checks it: every
// prompt decodes and fits the vocabulary of every model loaded from a
// checkpoint. The stages that generate check the lengths. With CheckPlan a
// missing file is no error; CheckShape reads no file.
func (j *Job) readPrompts(check Check) (*PromptData, spec.Errors) {
	sp := j.Spec
	path, at := sp.Data.Prompts, sp.At("data.prompts")
	switch {
	case !j.reads(SourcePrompts, path):
		if path != "" {
			return nil, spec.Errors{spec.Errorf(at, "data.prompts: no stage reads the prompts file (a generate stage does)")}
		}
		return nil, nil
	case path == "":
		return nil, spec.Errors{spec.Errorf(sp.Data.Pos, "data: a generate stage reads the prompts, and data.prompts names no file")}
	case check == CheckShape:
		return nil, nil
	}
	if _, err := os.Stat(path); err != nil {
		if check == CheckPlan && errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, spec.Errors{spec.Errorf(at, "data.prompts: %s: %v", path, unwrapPathErr(err))}
	}
	prompts, err := rollout.ReadPrompts(path)
	var errs spec.Errors
	if err != nil {
		errs = lineErrors(at, path, err)
	}
	var issues rollout.ErrorList
	for _, m := range j.loadedModels() {
		for _, p := range prompts {
			for k, t := range p.Tokens {
				if int(t) >= m.Config.VocabSize {
					issues = append(issues, &rollout.LineError{Line: p.Line, Msg: fmt.Sprintf("prompt %d: prompt_tokens[%d]: %d is outside the vocabulary of %d (model %q)", p.Index, k, t, m.Config.VocabSize, m.Name())})
					break
				}
			}
		}
	}
	if len(issues) > 0 {
		errs = append(errs, lineErrors(at, path, issues)...)
	}
	if len(errs) > 0 || sp.Data.RolloutBatchSize <= 0 {
		return nil, errs
	}
	return &PromptData{Prompts: prompts, PerStep: sp.Data.RolloutBatchSize}, nil
}

// loadedModels returns the job's models loaded from a checkpoint (not
// copies), in spec order.
func (j *Job) loadedModels() []*Model {
	var out []*Model
	for _, sm := range j.Spec.Models {
		if m := j.Models[sm.Name]; m != nil && m.Config != nil && sm.CopyOf == "" {
			out = append(out, m)
		}
	}
	return out
}

// readData reads data.rollouts and checks it against the job: every sample
// decodes, fits the vocabulary of every model and data.max_seq_len; prompt
// groups have samples_per_prompt samples; the file holds whole rollout
// batches (rollout_batch_size groups), each of whole groups; and the
// samples carry the fields the recipe needs (rollout log-probs). With
// CheckPlan a missing file is no error; CheckShape reads no file.
func (j *Job) readData(check Check) (*Data, spec.Errors) {
	sp := j.Spec
	path := sp.Data.Rollouts
	at := sp.At("data.rollouts")
	switch {
	case check == CheckRunOwnData:
		return nil, nil // the caller's
	case !j.reads(SourceRollouts, path):
		if path != "" {
			return nil, spec.Errors{spec.Errorf(at, "data.rollouts: no stage reads the rollout file (another stage produces the rollouts)")}
		}
		return nil, nil
	case path == "":
		return nil, spec.Errors{spec.Errorf(sp.Data.Pos, "data: a pack stage reads the rollouts, and data.rollouts names no file (or add a generate stage)")}
	case check == CheckShape:
		return nil, nil
	}
	if _, err := os.Stat(path); err != nil {
		if check == CheckPlan && errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, spec.Errors{spec.Errorf(at, "data.rollouts: %s: %v", path, unwrapPathErr(err))}
	}
	if sp.Bad("data") {
		// The data section's errors left defaults in place of its values,
		// which the file would be checked against wrongly.
		return nil, nil
	}
	samples, err := rollout.Read(path)
	var errs spec.Errors
	if err != nil {
		// The lines that decoded are checked too, so every problem of the
		// file shows at once.
		errs = lineErrors(at, path, err)
		if len(samples) == 0 {
			return nil, errs
		}
	}
	var issues rollout.ErrorList
	for _, m := range j.loadedModels() {
		if err := rollout.CheckVocab(samples, m.Config.VocabSize); err != nil {
			var l rollout.ErrorList
			if errors.As(err, &l) {
				issues = append(issues, l...)
			}
		}
	}
	for _, s := range samples {
		if len(s.Tokens) > sp.Data.MaxSeqLen {
			issues = append(issues, &rollout.LineError{Line: s.Line, Msg: fmt.Sprintf("sample %d has %d tokens, more than data.max_seq_len %d", s.Index, len(s.Tokens), sp.Data.MaxSeqLen)})
		}
	}
	if _, err := rollout.Groups(samples, sp.Data.SamplesPerPrompt); err != nil {
		var l rollout.ErrorList
		if errors.As(err, &l) {
			issues = append(issues, l...)
		} else {
			errs = append(errs, spec.Errorf(at, "data.rollouts: %s: %v", path, err))
		}
	}
	if need := j.rolloutLogProbsNeeded(); need != "" && samples[0].RolloutLogProbs == nil {
		errs = append(errs, spec.Errorf(at, "data.rollouts: %s has no rollout_log_probs, which %s needs", path, need))
	}
	if len(issues) > 0 {
		errs = append(errs, lineErrors(at, path, issues)...)
	}
	B := sp.Data.RolloutSamples()
	if B <= 0 || err != nil {
		return nil, errs // reported: by the spec, or the lines that did not decode
	}
	if len(samples)%B != 0 {
		errs = append(errs, spec.Errorf(at, "data.rollouts: %s holds %d samples, not a whole number of rollout batches of %d (rollout_batch_size %d × samples_per_prompt %d): %d left over",
			path, len(samples), B, sp.Data.RolloutBatchSize, sp.Data.SamplesPerPrompt, len(samples)%B))
		return nil, errs
	}
	d := &Data{Samples: samples}
	for start := 0; start < len(samples); start += B {
		idx := make([]int, B)
		for k := range idx {
			idx[k] = start + k
		}
		d.Batches = append(d.Batches, idx)
	}
	errs = append(errs, wholeGroups(path, samples, d.Batches)...)
	if len(errs) > 0 {
		return nil, errs
	}
	return d, nil
}

// wholeGroups reports prompt groups split between rollout batches: their
// advantages are computed over one batch.
func wholeGroups(path string, samples []rollout.Sample, batches [][]int) spec.Errors {
	batchOf := map[int]int{}
	var errs spec.Errors
	for b, idx := range batches {
		for _, i := range idx {
			g := samples[i].Group
			if prev, ok := batchOf[g]; ok && prev != b {
				errs = append(errs, spec.Errorf(filePos(path, samples[i].Line), "group %d has samples in rollout batches %d and %d: a step's advantages are computed over whole groups, so a group's samples belong in one rollout batch", g, prev+1, b+1))
				batchOf[g] = b
				if len(errs) == maxDataErrors {
					return errs
				}
				continue
			}
			batchOf[g] = b
		}
	}
	return errs
}

// filePos is the position of a line of a data file.
func filePos(path string, line int) spec.Pos { return spec.Pos{File: path, Line: line, Col: 1} }

// rolloutLogProbsNeeded names what in the recipe needs the rollout
// engine's log-probs, or "".
func (j *Job) rolloutLogProbsNeeded() string {
	for _, st := range j.Order {
		if t, ok := j.Stages[st.ID].(*Train); ok {
			switch {
			case t.UseRolloutLogProbs:
				return fmt.Sprintf("stage %q (use_rollout_log_probs)", st.ID)
			case t.TIS != "":
				return fmt.Sprintf("stage %q (tis: %s)", st.ID, t.TIS)
			}
		}
	}
	return ""
}

// lineErrors turns the problems of the rollout file into spec errors at
// their lines of the file, the first maxDataErrors one by one.
func lineErrors(at spec.Pos, path string, err error) spec.Errors {
	var list rollout.ErrorList
	var one *rollout.LineError
	switch {
	case errors.As(err, &list):
	case errors.As(err, &one):
		list = rollout.ErrorList{one}
	default:
		return spec.Errors{spec.Errorf(at, "data.rollouts: %v", err)}
	}
	var errs spec.Errors
	for i, e := range list {
		if i == maxDataErrors {
			errs = append(errs, spec.Errorf(at, "data.rollouts: %s: %d more problems", path, len(list)-maxDataErrors))
			break
		}
		if e.Line == 0 {
			errs = append(errs, spec.Errorf(at, "data.rollouts: %s: %s", path, e.Msg))
			continue
		}
		errs = append(errs, spec.Errorf(filePos(path, e.Line), "%s", e.Msg))
	}
	return errs
}
