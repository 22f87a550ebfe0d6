package stages

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rlpipe/rlpipe/model"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/engines"
)

func init() {
	Register(Kind{Name: "push_weights", Phase: spec.Step,
		Doc: "write the actor as an HF checkpoint (streamed, atomically replaced) and have the engine load it",
		New: func() Stage { return &PushWeights{Model: "actor", DType: "bf16", TimeoutS: 600} }})
}

var _ Stage = (*PushWeights)(nil)

// PushWeights hands a model's weights, as the step's train stage left
// them, to the inference engine: it gathers one FSDP unit at a time, rank 0
// streams each unit's tensors into a new version directory beside Dir
// (Dir.step-N: config.json and model.safetensors, written to a temporary
// directory and renamed), points the symbolic link Dir at it atomically,
// removes the previous version, and asks the engine to load the new one
// (SGLang's /update_weights_from_disk, vLLM's reload_weights). Typically
// under `when`.
type PushWeights struct {
	Model string `yaml:"model"`
	// Dir is the path the engine reads: rlpipe keeps it a symbolic link to
	// the latest version. Relative to the spec's directory.
	Dir   string `yaml:"dir"`
	DType string `yaml:"dtype"` // bf16 (default), fp16 or fp32
	// Engine and URL name the engine to reload; without them the stage
	// only writes the checkpoint.
	Engine   string  `yaml:"engine"`
	URL      string  `yaml:"url"`
	TimeoutS float64 `yaml:"timeout_s"`

	dir    string // Dir resolved
	client engines.Client
}

// Ports declares the model's weights input and the version output: the
// directory written this step, which a sleep stage may have the engine load.
func (s *PushWeights) Ports(*spec.Spec) Ports {
	return Ports{In: []Input{{Port: Port{Name: "weights", Type: TypeWeights(s.Model)}}},
		Out: []Port{{Name: "version", Type: TypePushed(s.Model)}}}
}

// Validate checks the model, the directory, the dtype and the engine.
func (s *PushWeights) Validate(vc *ValidateContext) spec.Errors {
	_, errs := vc.model("model", s.Model)
	if s.Dir == "" {
		errs = append(errs, vc.Errorf("dir", "dir is required: the directory the engine loads the weights from"))
	} else {
		s.dir = s.Dir
		if !filepath.IsAbs(s.dir) {
			s.dir = filepath.Join(vc.Job.Spec.Dir, s.dir)
		}
		if fi, err := os.Lstat(s.dir); err == nil && fi.Mode()&os.ModeSymlink == 0 {
			errs = append(errs, vc.Errorf("dir", "%s exists and is not the link push_weights keeps to its latest version; name a new path", s.dir))
		}
		if fi, err := os.Stat(filepath.Dir(s.dir)); err != nil || !fi.IsDir() {
			errs = append(errs, vc.Errorf("dir", "the parent of %s is not a directory", s.dir))
		}
	}
	if _, err := ExportDType(s.DType); err != nil {
		errs = append(errs, vc.Errorf("dtype", "%v", err))
	}
	c, e := controlClient(vc, s.Engine, s.URL, s.TimeoutS)
	s.client = c
	return append(errs, e...)
}

// Plan declares one gathered unit at a time.
func (s *PushWeights) Plan(pc *PlanContext) error { return pc.run(s.program) }

// Run writes the checkpoint and reloads the engine.
func (s *PushWeights) Run(ctx context.Context, rc *RunContext) error { return rc.run(ctx, s.program) }

func (s *PushWeights) program(p *prog) {
	st, _ := p.in("weights").(*ShardState)
	if p.err != nil {
		return
	}
	d := newDecoder(p, st, 1, 1, false)
	cfg := st.Model.Config
	dt, _ := ExportDType(s.DType)
	version := fmt.Sprintf("%s.step-%d", s.dir, p.stepOr0())
	tmp := version + ".tmp"
	var w *model.SafetensorsWriter
	var bytes int64
	var host []float32 // one slot's values, reused
	t0 := time.Now()
	p.op("open version")
	p.do(func() error {
		if p.r.ID != 0 {
			return nil
		}
		var specs []model.TensorSpec
		for _, u := range st.Units {
			for _, sl := range u.Slots {
				if !sl.Tied {
					specs = append(specs, model.TensorSpec{Name: sl.Name, DType: dt, Shape: sl.Shape})
					bytes += sl.Elems() * int64(model.DTypeSize(dt))
				}
			}
		}
		os.RemoveAll(tmp)
		if err := os.MkdirAll(tmp, 0o755); err != nil {
			return err
		}
		out := *cfg
		out.DType = map[string]string{model.F32: "float32", model.BF16: "bfloat16", model.F16: "float16"}[dt]
		js, err := out.MarshalHF()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, model.ConfigFileName), js, 0o644); err != nil {
			return err
		}
		w, err = model.NewSafetensorsWriter(filepath.Join(tmp, model.SingleFileName), specs)
		return err
	})
	for i, u := range st.Units {
		g := d.gather(i, "", false)
		op := p.op("write " + u.Name)
		d.untilGathered(op, g)
		p.do(func() error {
			if err := d.await(g); err != nil {
				return err
			}
			if p.r.ID != 0 {
				return nil
			}
			for _, sl := range u.Slots {
				if sl.Tied {
					continue
				}
				v, err := d.source(i, g)(sl)
				if err != nil {
					return err
				}
				if int64(cap(host)) < sl.Elems() {
					host = make([]float32, sl.Elems())
				}
				data := host[:sl.Elems()]
				if err := p.r.B.Download(data, v); err != nil {
					return err
				}
				if err := w.Write(sl.Name, data); err != nil {
					return err
				}
			}
			return nil
		})
	}
	p.out("version", version)
	p.op("publish and reload")
	p.do(func() error {
		if p.r.ID != 0 {
			return nil
		}
		if err := w.Close(); err != nil {
			return err
		}
		w = nil
		if err := publish(s.dir, tmp, version); err != nil {
			return err
		}
		written := time.Since(t0)
		p.report("push_write_s", written.Seconds())
		p.report("push_gb", float64(bytes)/1e9)
		if s.client == nil {
			return nil
		}
		t1 := time.Now()
		if err := s.client.ReloadFromDisk(p.ctx, version); err != nil {
			return fmt.Errorf("reload %s: %w", version, err)
		}
		p.report("push_reload_s", time.Since(t1).Seconds())
		return nil
	})
	if w != nil {
		w.Abort() // an op failed before the file was closed
	}
}

// stepOr0 is the step being run, or 0 while planning.
func (p *prog) stepOr0() int {
	if p.running() {
		return p.r.Step
	}
	return 0
}

// publish makes the written directory tmp the version dir, points the
// link at it atomically (a new link renamed over the old one) and removes
// the version the link pointed at before.
func publish(link, tmp, version string) error {
	os.RemoveAll(version)
	if err := os.Rename(tmp, version); err != nil {
		return err
	}
	old, _ := os.Readlink(link)
	next := link + ".link"
	os.Remove(next)
	if err := os.Symlink(filepath.Base(version), next); err != nil {
		return err
	}
	if err := os.Rename(next, link); err != nil {
		return err
	}
	if old != "" && old != filepath.Base(version) {
		if !filepath.IsAbs(old) {
			old = filepath.Join(filepath.Dir(link), old)
		}
		return os.RemoveAll(old)
	}
	return nil
}
