package rollout

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// line is one sample in rlpipe's own JSONL dialect.
type line struct {
	PromptTokens    []int32   `json:"prompt_tokens"`
	ResponseTokens  []int32   `json:"response_tokens"`
	Reward          float64   `json:"reward"`
	Group           int       `json:"group"`
	LossMask        []float32 `json:"loss_mask,omitempty"`
	RolloutLogProbs []float32 `json:"rollout_log_probs,omitempty"`
}

// Encode writes samples to w in rlpipe's own dialect, one line each. The loss
// mask is written only when it is not all ones; rollout log-probs only when
// present. Every sample is validated first (see Sample.Validate) and nothing
// is written when one is invalid.
func Encode(w io.Writer, samples []Sample) error {
	var errs ErrorList
	for i := range samples {
		if err := samples[i].Validate(); err != nil {
			errs = append(errs, &LineError{Msg: err.Error()})
		}
	}
	if err := errs.err(); err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	for i := range samples {
		s := &samples[i]
		p := s.PromptLength()
		l := line{
			PromptTokens:    s.Tokens[:p],
			ResponseTokens:  s.Tokens[p:],
			Reward:          s.Reward,
			Group:           s.Group,
			RolloutLogProbs: s.RolloutLogProbs,
		}
		for _, m := range s.LossMask {
			if m != 1 {
				l.LossMask = s.LossMask
				break
			}
		}
		if err := enc.Encode(&l); err != nil {
			return fmt.Errorf("sample %d: %w", s.Index, err)
		}
	}
	return nil
}

// Write writes samples to path in rlpipe's own dialect (see Encode). It
// writes a temporary file in the same directory and renames it over path, so
// a failed write leaves no partial file.
func Write(path string, samples []Sample) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	// CreateTemp makes the file 0600; the result is a file users share.
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	if err = Encode(bw, samples); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err = bw.Flush(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
