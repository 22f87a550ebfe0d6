package cli

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLogprobs runs rlpipe logprobs on the HF golden model and samples of
// package model (testdata/hf/llama, made by transformers): the log-probs
// must match transformers' at T = 0.7, and, with rollout log-probs written
// as those minus 0.1, the mismatch summary must measure x = 0.1 on every
// loss-masked token.
func TestLogprobs(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "model", "testdata", "hf", "llama")
	var g struct {
		Samples []struct {
			Tokens         []int     `json:"tokens"`
			ResponseLength int       `json:"response_length"`
			Reward         float64   `json:"reward"`
			Group          int       `json:"group"`
			LossMask       []float64 `json:"loss_mask"`
		} `json:"samples"`
		Cases map[string]struct {
			LogP []float64 `json:"logp"`
		} `json:"temperature_cases"`
	}
	if err := json.Unmarshal(readAll(t, filepath.Join(dir, "golden.json")), &g); err != nil {
		t.Fatal(err)
	}
	want := g.Cases["0.7"].LogP
	const shift = 0.1
	tmp := t.TempDir()
	data := filepath.Join(tmp, "rollouts.jsonl")
	var b strings.Builder
	off, masked := 0, 0
	for _, s := range g.Samples {
		ro := make([]float64, s.ResponseLength)
		for k := range ro {
			ro[k] = want[off+k] - shift
		}
		for _, m := range s.LossMask {
			if m != 0 {
				masked++
			}
		}
		off += s.ResponseLength
		line, _ := json.Marshal(map[string]any{"tokens": s.Tokens, "response_length": s.ResponseLength, "reward": s.Reward,
			"group_index": s.Group, "loss_mask": s.LossMask, "rollout_log_probs": ro})
		b.Write(append(line, '\n'))
	}
	if err := os.WriteFile(data, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, sum := filepath.Join(tmp, "logprobs.jsonl"), filepath.Join(tmp, "summary.json")
	code, _, errs := runCLI(t, "logprobs", "--backend", "cpu", "--precision", "fp32", "--temperature", "0.7", "--batch", "2",
		"--out", out, "--summary", sum, filepath.Join(dir, "model"), data)
	if code != exitOK {
		t.Fatalf("logprobs exit %d\n%s", code, errs)
	}
	if !strings.Contains(errs, "3 samples, 20 response tokens") {
		t.Errorf("summary:\n%s", errs)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var got []float64
	lines := 0
	for sc.Scan() {
		var l struct {
			Index   int       `json:"index"`
			LogP    []float64 `json:"logp"`
			Entropy []float64 `json:"entropy"`
			Abs     *float64  `json:"mismatch_abs"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		if l.Index != lines || len(l.Entropy) != len(l.LogP) || l.Abs == nil || math.Abs(*l.Abs-shift) > 1e-5 {
			t.Errorf("line %d: index %d, %d entropies for %d log-probs, mismatch_abs %v", lines+1, l.Index, len(l.Entropy), len(l.LogP), l.Abs)
		}
		got = append(got, l.LogP...)
		lines++
	}
	if lines != 3 || len(got) != len(want) {
		t.Fatalf("%d lines and %d log-probs, want 3 and %d", lines, len(got), len(want))
	}
	for k := range want {
		if d := math.Abs(got[k] - want[k]); d > 1e-5*math.Max(math.Abs(want[k]), 1e-2) {
			t.Errorf("token %d: log-prob %v, transformers %v", k, got[k], want[k])
		}
	}
	var s mismatchResult
	if err := json.Unmarshal(readAll(t, sum), &s); err != nil {
		t.Fatal(err)
	}
	k3 := math.Exp(-shift) - 1 + shift
	if s.RolloutTokens != masked || math.Abs(s.MeanAbs-shift) > 1e-5 || math.Abs(s.MeanK3-k3) > 1e-6 || s.OverCap != 0 || math.Abs(s.MaxAbs-shift) > 1e-5 {
		t.Errorf("summary %+v; want %d tokens, mean |x| %v, mean k3 %v, none over the cap", s, masked, shift, k3)
	}
}
