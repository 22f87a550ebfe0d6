package model

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/stages/rl"
)

// testBackends are the backends the parity tests run on: the CPU always;
// decoder_cuda_test.go adds CUDA, whose subtests skip without a driver.
var testBackends = []struct {
	name string
	new  func(t *testing.T) gpu.Backend
}{{"cpu", func(*testing.T) gpu.Backend { return cpu.New() }}}

// forBackends runs f for every test backend and family as subtests.
func forBackends(t *testing.T, f func(t *testing.T, b gpu.Backend, fam string)) {
	for _, tb := range testBackends {
		for _, fam := range families {
			t.Run(tb.name+"/"+fam, func(t *testing.T) { f(t, tb.new(t), fam) })
		}
	}
}

// testArena bump-allocates tensors from one backend allocation.
type testArena struct {
	t   *testing.T
	b   gpu.Backend
	mem gpu.Memory
	off int64
}

func newTestArena(t *testing.T, b gpu.Backend, bytes int64) *testArena {
	t.Helper()
	mem, err := b.Alloc(bytes)
	if err != nil {
		t.Fatal(err)
	}
	return &testArena{t: t, b: b, mem: mem}
}

func (a *testArena) tensor(dt gpu.DType, shape ...int) gpu.Tensor {
	a.t.Helper()
	x, err := gpu.NewTensor(a.mem, a.off, dt, shape...)
	if err != nil {
		a.t.Fatal(err)
	}
	a.off += (x.Bytes() + 255) / 256 * 256
	return x
}

func (a *testArena) i32(vals []int32) gpu.Tensor {
	a.t.Helper()
	x := a.tensor(gpu.I32, len(vals))
	if err := a.b.UploadI32(x, vals); err != nil {
		a.t.Fatal(err)
	}
	return x
}

func (a *testArena) f32(vals []float32) gpu.Tensor {
	a.t.Helper()
	x := a.tensor(gpu.F32, len(vals))
	if err := a.b.Upload(x, vals); err != nil {
		a.t.Fatal(err)
	}
	return x
}

func (a *testArena) down(x gpu.Tensor) []float32 {
	a.t.Helper()
	f := make([]float32, x.Numel())
	if err := a.b.Download(f, x); err != nil {
		a.t.Fatal(err)
	}
	return f
}

// golden is the part of golden.json the decoder tests use.
type golden struct {
	Samples []struct {
		Tokens         []int32   `json:"tokens"`
		PromptLength   int       `json:"prompt_length"`
		ResponseLength int       `json:"response_length"`
		LossMask       []float32 `json:"loss_mask"`
	} `json:"samples"`
	TemperatureCases map[string]struct {
		LogP    []float64 `json:"logp"`
		Entropy []float64 `json:"entropy"`
	} `json:"temperature_cases"`
	OldLogP    []float64 `json:"old_logp"`
	RefLogP    []float64 `json:"ref_logp"`
	Advantages []float64 `json:"advantages"`
	LossConfig struct {
		EpsClip         float64 `json:"eps_clip"`
		EpsClipHigh     float64 `json:"eps_clip_high"`
		DualClipC       float64 `json:"dual_clip_c"`
		KL              string  `json:"kl"`
		KLCoef          float64 `json:"kl_coef"`
		EntropyCoef     float64 `json:"entropy_coef"`
		Aggregation     string  `json:"aggregation"`
		GlobalBatchSize int     `json:"global_batch_size"`
		DPSize          int     `json:"dp_size"`
	} `json:"loss_config"`
	Loss          float64            `json:"loss"`
	MetricsSum    map[string]float64 `json:"metrics_sum"`
	GradNorms     map[string]float64 `json:"grad_norms"`
	TotalGradNorm float64            `json:"total_grad_norm"`
	GradClipCoef  float64            `json:"grad_clip_coef"`
	Optimizer     struct {
		LR          float64   `json:"lr"`
		Betas       []float64 `json:"betas"`
		Eps         float64   `json:"eps"`
		WeightDecay float64   `json:"weight_decay"`
		GradClip    float64   `json:"grad_clip"`
		GradClipEps float64   `json:"grad_clip_eps"`
	} `json:"optimizer"`
	AfterStep struct {
		LogP []float64 `json:"logp"`
	} `json:"after_step"`
}

func loadGolden(t *testing.T, dir string) *golden {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	return &g
}

// readF32Safetensors reads every F32 tensor of a safetensors file.
func readF32Safetensors(t *testing.T, path string) map[string][]float32 {
	t.Helper()
	f, err := ReadHeader(path)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]float32{}
	for _, ti := range f.Tensors {
		if ti.DType != F32 {
			t.Fatalf("%s: tensor %s is %s, want F32", path, ti.Name, ti.DType)
		}
		raw := data[f.DataStart()+ti.Begin : f.DataStart()+ti.End]
		v := make([]float32, len(raw)/4)
		if err := binary.Read(bytes.NewReader(raw), binary.LittleEndian, v); err != nil {
			t.Fatal(err)
		}
		out[ti.Name] = v
	}
	return out
}

// packed is the golden samples packed into one varlen row.
type packed struct {
	ids, pos, cu, logitPos, targets []int32
	lengths                         []int
	mask                            []float32
}

func packSamples(g *golden) packed {
	var p packed
	p.cu = []int32{0}
	for _, s := range g.Samples {
		p.ids = append(p.ids, s.Tokens...)
		for i := range s.Tokens {
			p.pos = append(p.pos, int32(i))
		}
		end := int32(len(p.ids))
		p.cu = append(p.cu, end)
		r := int32(s.ResponseLength)
		for j := end - 1 - r; j < end-1; j++ {
			p.logitPos = append(p.logitPos, j)
			p.targets = append(p.targets, p.ids[j+1])
		}
		p.lengths = append(p.lengths, s.ResponseLength)
		p.mask = append(p.mask, s.LossMask...)
	}
	return p
}

// testModel is a checkpoint loaded into per-unit gathered fp32 buffers
// (which double as the fp32 master, since the test runs with one rank but
// pads the layout as for dp ranks).
type testModel struct {
	c      *Config
	units  []Unit
	slots  [][]Slot
	master []gpu.Tensor // F32, one per unit
}

const testDP = 3 // pads every parameter as for 3 ranks

func loadTestModel(t *testing.T, a *testArena, dir string) *testModel {
	t.Helper()
	return loadTestModelDP(t, a, dir, testDP)
}

// loadTestModelDP is loadTestModel with the layouts of dp ranks.
func loadTestModelDP(t *testing.T, a *testArena, dir string, dp int) *testModel {
	t.Helper()
	c, err := LoadConfig(filepath.Join(dir, "model"))
	if err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(filepath.Join(dir, "model"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if err := ck.Check(c); err != nil {
		t.Fatal(err)
	}
	m := &testModel{c: c, units: c.Units()}
	for _, u := range m.units {
		slots := c.Layout(u, dp)
		host := make([]float32, LayoutElems(slots))
		for _, s := range slots {
			if s.Tied {
				continue // filled from the embedding unit before use
			}
			if err := ck.ReadRows(s.Name, 0, s.Rows(), host[s.Offset:s.Offset+s.Elems()]); err != nil {
				t.Fatal(err)
			}
		}
		m.slots = append(m.slots, slots)
		m.master = append(m.master, a.f32(host))
	}
	return m
}

// run is one pass of the test pipeline.
type run struct {
	t     *testing.T
	a     *testArena
	m     *testModel
	p     packed
	dt    gpu.DType // compute dtype of activations and gathered weights
	gdt   gpu.DType // gradient dtype
	batch Batch

	gathered []gpu.Tensor
	ids      gpu.Tensor
	logitPos gpu.Tensor
	targets  gpu.Tensor
	resid    gpu.Tensor
	inputs   []gpu.Tensor // saved fp32 layer inputs
	acts     []LayerActs  // saved activations, one per layer
	rc       LayerActs    // recompute buffers
	gb       LayerGradBufs
	rows     gpu.Tensor
	xn       gpu.Tensor
	rstd     gpu.Tensor
	logp     gpu.Tensor
	entropy  gpu.Tensor
	logits   gpu.Tensor
	chunk    int
}

func newRun(t *testing.T, a *testArena, m *testModel, p packed, dt, gdt gpu.DType) *run {
	t.Helper()
	r := &run{t: t, a: a, m: m, p: p, dt: dt, gdt: gdt, chunk: 7}
	c := m.c
	tt := len(p.ids)
	n := len(p.logitPos)
	r.batch = Batch{Positions: a.i32(p.pos), CuSeqlens: a.i32(p.cu), T: tt}
	r.ids = a.i32(p.ids)
	r.logitPos = a.i32(p.logitPos)
	r.targets = a.i32(p.targets)
	r.resid = a.tensor(gpu.F32, tt, c.HiddenSize)
	for range c.NumLayers {
		r.inputs = append(r.inputs, a.tensor(gpu.F32, tt, c.HiddenSize))
		r.acts = append(r.acts, newActs(a, c, tt, dt))
	}
	r.rc = newActs(a, c, tt, dt)
	h := c.HiddenSize
	r.gb = newGradBufs(a, c, tt, dt)
	r.rows = a.tensor(gpu.F32, n, h)
	r.xn = a.tensor(dt, n, h)
	r.rstd = a.tensor(gpu.F32, n)
	r.logp = a.tensor(gpu.F32, n)
	r.entropy = a.tensor(gpu.F32, n)
	r.logits = a.tensor(gpu.F32, r.chunk, c.VocabSize)
	r.gather()
	return r
}

// gather makes the compute copies of the units from the master buffers,
// filling the tied head's embedding slot from the embedding unit.
func (r *run) gather() {
	r.t.Helper()
	b := r.a.b
	r.gathered = r.gathered[:0]
	for i, mt := range r.m.master {
		g := mt
		if r.dt != gpu.F32 {
			g = r.a.tensor(r.dt, mt.Numel())
			if err := b.Copy(g, mt); err != nil {
				r.t.Fatal(err)
			}
		}
		r.gathered = append(r.gathered, g)
		for _, s := range r.m.slots[i] {
			if !s.Tied {
				continue
			}
			dst, err := SlotView(s, g)
			if err != nil {
				r.t.Fatal(err)
			}
			src, err := SlotView(r.m.slots[0][0], r.m.master[0])
			if err != nil {
				r.t.Fatal(err)
			}
			if err := b.Copy(dst, src); err != nil {
				r.t.Fatal(err)
			}
		}
	}
}

// newGradBufs allocates a layer's backward scratch for tt rows.
func newGradBufs(a *testArena, c *Config, tt int, dt gpu.DType) LayerGradBufs {
	h, in, qd, kd := c.HiddenSize, c.IntermediateSize, c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	return LayerGradBufs{
		Dy: a.tensor(dt, tt, h), Dgate: a.tensor(dt, tt, in), Dup: a.tensor(dt, tt, in),
		Dxn2: a.tensor(dt, tt, h), DyO: a.tensor(dt, tt, h), Dattn: a.tensor(dt, tt, qd), Dq: a.tensor(dt, tt, qd),
		Dk: a.tensor(dt, tt, kd), Dv: a.tensor(dt, tt, kd), Dxn: a.tensor(dt, tt, h),
	}
}

func newActs(a *testArena, c *Config, tt int, dt gpu.DType) LayerActs {
	h, in, hq, hkv, d := c.HiddenSize, c.IntermediateSize, c.NumHeads, c.NumKVHeads, c.HeadDim
	x := LayerActs{
		Xn: a.tensor(dt, tt, h), Rstd1: a.tensor(gpu.F32, tt),
		Q: a.tensor(dt, tt, hq, d), K: a.tensor(dt, tt, hkv, d), V: a.tensor(dt, tt, hkv, d),
		Attn: a.tensor(dt, tt, hq, d), LSE: a.tensor(gpu.F32, hq, tt),
		Mid: a.tensor(gpu.F32, tt, h), Xn2: a.tensor(dt, tt, h), Rstd2: a.tensor(gpu.F32, tt),
		Gate: a.tensor(dt, tt, in), Up: a.tensor(dt, tt, in), Act: a.tensor(dt, tt, in),
		OOut: a.tensor(dt, tt, h), DownOut: a.tensor(dt, tt, h),
	}
	if c.QKNorm {
		x.QRaw = a.tensor(dt, tt, hq*d)
		x.KRaw = a.tensor(dt, tt, hkv*d)
		x.RstdQ = a.tensor(gpu.F32, tt*hq)
		x.RstdK = a.tensor(gpu.F32, tt*hkv)
	}
	return x
}

func (r *run) layerWeights(l int, flat gpu.Tensor) LayerWeights {
	r.t.Helper()
	w, err := r.m.c.LayerWeightsFrom(r.m.units[l+1], r.m.slots[l+1], flat)
	if err != nil {
		r.t.Fatal(err)
	}
	return w
}

func (r *run) headWeights(flat gpu.Tensor) HeadWeights {
	r.t.Helper()
	u := len(r.m.units) - 1
	w, err := r.m.c.HeadWeightsFrom(r.m.units[u], r.m.slots[u], flat)
	if err != nil {
		r.t.Fatal(err)
	}
	return w
}

// forward runs embedding, layers and the head at temperature temp and
// returns logp and entropy.
func (r *run) forward(temp float32) ([]float32, []float32) {
	r.t.Helper()
	b, c := r.a.b, r.m.c
	embed, err := SlotView(r.m.slots[0][0], r.gathered[0])
	if err != nil {
		r.t.Fatal(err)
	}
	if err := b.Embedding(r.resid, embed, r.ids); err != nil {
		r.t.Fatal(err)
	}
	for l := range c.NumLayers {
		if err := b.Copy(r.inputs[l], r.resid); err != nil {
			r.t.Fatal(err)
		}
		if err := c.LayerForward(b, r.layerWeights(l, r.gathered[l+1]), &r.acts[l], r.resid, r.resid, r.batch); err != nil {
			r.t.Fatal(err)
		}
	}
	if err := SelectRows(b, r.rows, r.resid, r.logitPos); err != nil {
		r.t.Fatal(err)
	}
	hw := r.headWeights(r.gathered[len(r.gathered)-1])
	if err := c.HeadForward(b, hw, r.rows, r.xn, r.rstd, r.targets, r.logp, r.entropy, r.logits, r.chunk, Sampling{Temperature: temp}); err != nil {
		r.t.Fatal(err)
	}
	return r.a.down(r.logp), r.a.down(r.entropy)
}

// actMode is how the test backward gets a layer's activations.
type actMode int

const (
	kept       actMode = iota // the forward's, all of them
	recomputed                // a rerun of the layer's forward into one shared set of buffers
	lean                      // the forward's without xn, xn2 and act, which are poisoned (LayerActs.Lean)
	fused                     // as recomputed, with the q/k/v projections fused (LayerActs.QKV, LayerGradBufs.Dqkv)
)

// backward backpropagates dlogp and dentropy (after a forward at
// temperature 1) and returns one gradient buffer per unit (the gradient
// dtype, layout of the unit; the tied head's embedding slot is added into
// the embedding's gradient). mode says where each layer's activations
// come from.
func (r *run) backward(dlogp, dent []float32, mode actMode) []gpu.Tensor {
	r.t.Helper()
	b, c, a := r.a.b, r.m.c, r.a
	grads := make([]gpu.Tensor, len(r.m.units))
	for i, s := range r.m.slots {
		grads[i] = a.tensor(r.gdt, int(LayoutElems(s)))
		if err := b.Zero(grads[i]); err != nil {
			r.t.Fatal(err)
		}
	}
	n := len(r.p.logitPos)
	dl, de := a.f32(dlogp), a.f32(dent)
	dxn := a.tensor(r.dt, n, c.HiddenSize)
	drows := a.tensor(gpu.F32, n, c.HiddenSize)
	dres := a.tensor(gpu.F32, r.batch.T, c.HiddenSize)
	if err := b.Zero(dres); err != nil {
		r.t.Fatal(err)
	}
	hu := len(r.m.units) - 1
	hw, dhw := r.headWeights(r.gathered[hu]), r.headWeights(grads[hu])
	if err := c.HeadBackward(b, hw, dhw, r.rows, r.xn, r.rstd, r.targets, dl, de, dxn, drows, r.logits, r.chunk, Sampling{Temperature: 1}); err != nil {
		r.t.Fatal(err)
	}
	if err := ScatterAddRows(b, dres, drows, r.logitPos); err != nil {
		r.t.Fatal(err)
	}
	for l := c.NumLayers - 1; l >= 0; l-- {
		w, dw := r.layerWeights(l, r.gathered[l+1]), r.layerWeights(l, grads[l+1])
		acts := &r.acts[l]
		switch mode {
		case recomputed, fused:
			acts = &r.rc
			acts.QKV, r.gb.Dqkv = gpu.Tensor{}, gpu.Tensor{}
			if mode == fused {
				n := (c.NumHeads + 2*c.NumKVHeads) * c.HeadDim
				acts.QKV, r.gb.Dqkv = a.tensor(r.dt, r.batch.T, n), a.tensor(r.dt, r.batch.T, n)
			}
			if err := c.LayerForward(b, w, acts, r.inputs[l], gpu.Tensor{}, r.batch); err != nil {
				r.t.Fatal(err)
			}
		case lean:
			la := r.acts[l]
			la.Lean = true
			for _, x := range []gpu.Tensor{la.Xn, la.Xn2, la.Act} {
				if err := b.Fill(x, float32(math.NaN())); err != nil {
					r.t.Fatal(err)
				}
			}
			acts = &la
		}
		if err := c.LayerBackward(b, w, dw, acts, &r.gb, r.inputs[l], dres, r.batch); err != nil {
			r.t.Fatal(err)
		}
		r.gb.Dqkv = gpu.Tensor{}
	}
	dEmbed, err := SlotView(r.m.slots[0][0], grads[0])
	if err != nil {
		r.t.Fatal(err)
	}
	if err := b.EmbeddingBackward(dEmbed, dres, r.ids); err != nil {
		r.t.Fatal(err)
	}
	for _, s := range r.m.slots[hu] {
		if s.Tied {
			v, err := SlotView(s, grads[hu])
			if err != nil {
				r.t.Fatal(err)
			}
			if err := b.AddScaled(dEmbed, v, 1); err != nil {
				r.t.Fatal(err)
			}
		}
	}
	return grads
}

// params returns every owned parameter of the given per-unit buffers as
// float32, keyed by name.
func (r *run) params(bufs []gpu.Tensor) map[string][]float32 {
	r.t.Helper()
	out := map[string][]float32{}
	for i, slots := range r.m.slots {
		for _, s := range slots {
			if s.Tied {
				continue
			}
			v, err := SlotView(s, bufs[i])
			if err != nil {
				r.t.Fatal(err)
			}
			out[s.Name] = r.a.down(v)
		}
	}
	return out
}

// lossInputs builds the loss config, the rl batch (our log-probs and
// entropies, the golden's other inputs) and the mini-batch normalisation:
// dp ranks, GBS samples and the batch's loss-mask tokens.
func lossInputs(g *golden, p packed, logp, ent []float32) (rl.LossConfig, *rl.Batch, rl.Norm) {
	lc := g.LossConfig
	cfg := rl.LossConfig{
		Advantage: rl.AdvantageGRPO, NormalizeStd: true,
		EpsClip: lc.EpsClip, EpsClipHigh: lc.EpsClipHigh, DualClipC: lc.DualClipC,
		KL: lc.KL, KLCoef: lc.KLCoef, EntropyCoef: lc.EntropyCoef, Aggregation: lc.Aggregation,
	}
	f32 := func(x []float64) []float32 {
		o := make([]float32, len(x))
		for i, v := range x {
			o[i] = float32(v)
		}
		return o
	}
	b := &rl.Batch{
		LogP: logp, OldLogP: f32(g.OldLogP), RefLogP: f32(g.RefLogP), Entropy: ent,
		Mask: p.mask, Lengths: p.lengths, Advantages: g.Advantages,
	}
	tokens := float64(len(logp))
	if p.mask != nil {
		tokens = 0
		for _, m := range p.mask {
			tokens += float64(m)
		}
	}
	n := rl.Norm{DP: lc.DPSize, Samples: lc.GlobalBatchSize, Tokens: tokens, PGTokens: tokens}
	return cfg, b, n
}

// maxErr returns the largest absolute and relative (to |want|, floored at
// floor) differences.
func maxErr(got []float32, want []float64, floor float64) (abs, rel float64) {
	for i, w := range want {
		d := math.Abs(float64(got[i]) - w)
		abs = max(abs, d)
		rel = max(rel, d/math.Max(math.Abs(w), floor))
	}
	return abs, rel
}

// relL2 returns ‖got − want‖ / ‖want‖.
func relL2(got, want []float32) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

func relDiff(got, want float64) float64 {
	return math.Abs(got-want) / math.Max(math.Abs(want), 1e-12)
}

// families are the HF golden cases under testdata/hf: one per supported
// family, and llama_bias, a Llama with attention_bias (q/k/v and o_proj
// biases).
var families = []string{"llama", "qwen2", "qwen3", "mistral", "llama_bias"}

// TestDecoderParityHF checks the decoder against the HF goldens in fp32:
// log-probs and entropies at two temperatures, the loss and its metrics,
// every parameter gradient, the grad norms, one clipped AdamW step, the
// log-probs of the updated model, and activation recomputation.
func TestDecoderParityHF(t *testing.T) {
	const (
		logpTol  = 1e-5 // relative, floored at 1e-2 absolute scale
		lossTol  = 5e-5 // relative
		gradTol  = 1e-5 // relative L2 per parameter
		normTol  = 1e-5 // relative
		paramTol = 2e-6 // absolute, after the AdamW step
	)
	forBackends(t, func(t *testing.T, b gpu.Backend, fam string) {
		dir := filepath.Join("testdata", "hf", fam)
		g := loadGolden(t, dir)
		a := newTestArena(t, b, 24<<20)
		m := loadTestModel(t, a, dir)
		p := packSamples(g)
		r := newRun(t, a, m, p, gpu.F32, gpu.F32)

		// Log-probs at temperature 0.7, then 1.0 (kept for backward).
		lp07, _ := r.forward(0.7)
		abs, rel := maxErr(lp07, g.TemperatureCases["0.7"].LogP, 1e-2)
		t.Logf("logp T=0.7: max abs %.3g, max rel %.3g", abs, rel)
		if rel > logpTol {
			t.Errorf("logp T=0.7: max rel error %.3g > %g", rel, logpTol)
		}
		logp, ent := r.forward(1)
		for _, q := range []struct {
			name string
			got  []float32
			want []float64
		}{
			{"logp T=1", logp, g.TemperatureCases["1.0"].LogP},
			{"entropy T=1", ent, g.TemperatureCases["1.0"].Entropy},
		} {
			abs, rel := maxErr(q.got, q.want, 1e-2)
			t.Logf("%s: max abs %.3g, max rel %.3g", q.name, abs, rel)
			if rel > logpTol {
				t.Errorf("%s: max rel error %.3g > %g", q.name, rel, logpTol)
			}
		}

		// Loss and metrics.
		// The goldens are unnormalised sums over GBS samples; ComputeLoss
		// returns them divided by GBS.
		cfg, lb, norm := lossInputs(g, p, logp, ent)
		var out rl.Output
		if err := rl.ComputeLoss(cfg, lb, norm, &out); err != nil {
			t.Fatal(err)
		}
		met := out.Metrics
		gbs := float64(norm.Samples)
		worst := 0.0
		for _, q := range []struct {
			name      string
			got, want float64
		}{
			{"loss", out.Loss * gbs, g.Loss},
			{"pg_loss", met.PGLoss * gbs, g.MetricsSum["pg_loss"]},
			{"kl", met.KLLoss * gbs, g.MetricsSum["kl"]},
			{"entropy", met.EntropyLoss * gbs, g.MetricsSum["entropy"]},
			{"clipfrac", met.PGClipFrac * gbs, g.MetricsSum["clipfrac"]},
		} {
			d := relDiff(q.got, q.want)
			worst = max(worst, d)
			if d > lossTol {
				t.Errorf("%s = %.9g, golden %.9g (rel %.3g > %g)", q.name, q.got, q.want, d, lossTol)
			}
		}
		t.Logf("loss and metric sums: max rel %.3g", worst)

		// Gradients.
		grads := r.backward(out.DLogP, out.DEntropy, kept)
		gotG := r.params(grads)
		wantG := readF32Safetensors(t, filepath.Join(dir, "grads.safetensors"))
		if len(gotG) != len(wantG) {
			t.Fatalf("%d gradients, golden has %d", len(gotG), len(wantG))
		}
		worstG, worstN, total := 0.0, 0.0, 0.0
		for name, want := range wantG {
			got, ok := gotG[name]
			if !ok {
				t.Fatalf("no gradient for %s", name)
			}
			e := relL2(got, want)
			worstG = max(worstG, e)
			if e > gradTol {
				t.Errorf("grad %s: rel L2 error %.3g > %g", name, e, gradTol)
			}
			var ss float64
			for _, v := range got {
				ss += float64(v) * float64(v)
			}
			total += ss
			d := relDiff(math.Sqrt(ss), g.GradNorms[name])
			worstN = max(worstN, d)
			if d > normTol {
				t.Errorf("grad norm %s: %.9g, golden %.9g", name, math.Sqrt(ss), g.GradNorms[name])
			}
		}
		total = math.Sqrt(total)
		t.Logf("grads: max rel L2 %.3g; grad norms: max rel %.3g; total norm %.9g (golden %.9g, rel %.3g)",
			worstG, worstN, total, g.TotalGradNorm, relDiff(total, g.TotalGradNorm))
		if d := relDiff(total, g.TotalGradNorm); d > normTol {
			t.Errorf("total grad norm %.9g, golden %.9g", total, g.TotalGradNorm)
		}

		// Activation checkpointing, and lean layers (the element-wise
		// activations recomputed), give bit-identical gradients. The lean
		// run poisons the forward's xn, xn2 and act, so it goes last.
		sameGrads(t, b, grads, r.backward(out.DLogP, out.DEntropy, recomputed), "recomputed activations")
		fusedGrads(t, b, dir, p, gpu.F32, r.params(grads), out, 1e-5, "fused q/k/v projections")
		sameGrads(t, b, grads, r.backward(out.DLogP, out.DEntropy, lean), "lean layers")

		// Clip by global norm, then one AdamW step.
		r.step(g, grads)
		wantP := readF32Safetensors(t, filepath.Join(dir, "after_step.safetensors"))
		gotP := r.params(r.m.master)
		lr := g.Optimizer.LR
		var maxAbs, looseGrad float64
		loose, elems := 0, 0
		for name, want := range wantP {
			got := gotP[name]
			for i := range want {
				d := math.Abs(float64(got[i]) - float64(want[i]))
				elems++
				if d > paramTol {
					loose++
					looseGrad = max(looseGrad, math.Abs(float64(wantG[name][i])))
					if d > 2*lr+paramTol {
						t.Errorf("after step %s[%d] = %.9g, golden %.9g (grad %.3g)", name, i, got[i], want[i], wantG[name][i])
					}
					continue
				}
				maxAbs = max(maxAbs, d)
			}
		}
		t.Logf("after step: %d/%d elements within %g abs (max %.3g), %d within 2·lr only (their golden |grad| <= %.3g)",
			elems-loose, elems, paramTol, maxAbs, loose, looseGrad)
		if loose > elems/1000 {
			t.Errorf("%d elements differ by more than %g after the step", loose, paramTol)
		}
		r.gather()
		lpAfter, _ := r.forward(1)
		abs, rel = maxErr(lpAfter, g.AfterStep.LogP, 1e-2)
		t.Logf("after-step logp: max abs %.3g, max rel %.3g", abs, rel)
		if rel > logpTol {
			t.Errorf("after-step logp: max rel error %.3g > %g", rel, logpTol)
		}
	})
}

// step clips the gradients by their global norm and applies one AdamW step
// to the master parameters.
func (r *run) step(g *golden, grads []gpu.Tensor) {
	r.t.Helper()
	b := r.a.b
	type pv struct{ p, g gpu.Tensor }
	var views []pv
	var ss float64
	for i, slots := range r.m.slots {
		for _, s := range slots {
			if s.Tied {
				continue
			}
			pt, err := SlotView(s, r.m.master[i])
			if err != nil {
				r.t.Fatal(err)
			}
			gt, err := SlotView(s, grads[i])
			if err != nil {
				r.t.Fatal(err)
			}
			x, err := b.SumSquares(gt)
			if err != nil {
				r.t.Fatal(err)
			}
			ss += x
			views = append(views, pv{pt, gt})
		}
	}
	o := g.Optimizer
	coef := math.Min(1, o.GradClip/(math.Sqrt(ss)+o.GradClipEps))
	if d := relDiff(coef, g.GradClipCoef); d > 1e-4 {
		r.t.Errorf("clip coefficient %.9g, golden %.9g", coef, g.GradClipCoef)
	}
	for _, v := range views {
		mt := r.a.tensor(gpu.F32, v.p.Shape...)
		vt := r.a.tensor(gpu.F32, v.p.Shape...)
		// The clip coefficient is applied as AdamW reads the grads, as
		// torch's clip_grad_norm_ scales them in place before the step.
		st := gpu.AdamWStep{LR: o.LR, Beta1: o.Betas[0], Beta2: o.Betas[1], Eps: o.Eps, WeightDecay: o.WeightDecay, Step: 1, GradScale: float32(coef)}
		if err := b.AdamW(v.p, v.g, mt, vt, st); err != nil {
			r.t.Fatal(err)
		}
	}
}

// TestDecoderBF16 runs every family with bf16 activations, bf16 gathered
// weights and bf16 gradients (fp32 residual stream) against the fp32 HF
// goldens, with loose tolerances.
func TestDecoderBF16(t *testing.T) {
	const (
		logpAbs = 3e-2 // max abs error of logp and entropy
		gradTol = 4e-2 // rel L2 per parameter
	)
	forBackends(t, func(t *testing.T, b gpu.Backend, fam string) {
		dir := filepath.Join("testdata", "hf", fam)
		g := loadGolden(t, dir)
		a := newTestArena(t, b, 24<<20)
		m := loadTestModel(t, a, dir)
		p := packSamples(g)
		r := newRun(t, a, m, p, gpu.BF16, gpu.BF16)
		logp, ent := r.forward(1)
		for _, q := range []struct {
			name string
			got  []float32
			want []float64
		}{
			{"logp", logp, g.TemperatureCases["1.0"].LogP},
			{"entropy", ent, g.TemperatureCases["1.0"].Entropy},
		} {
			abs, _ := maxErr(q.got, q.want, 1e-2)
			t.Logf("bf16 %s: max abs %.3g", q.name, abs)
			if abs > logpAbs {
				t.Errorf("bf16 %s: max abs error %.3g > %g", q.name, abs, logpAbs)
			}
		}
		// Backward from the loss of our bf16 log-probs and the golden's
		// other loss inputs, with recomputed activations.
		cfg, lb, norm := lossInputs(g, p, logp, ent)
		var out rl.Output
		if err := rl.ComputeLoss(cfg, lb, norm, &out); err != nil {
			t.Fatal(err)
		}
		grads := r.backward(out.DLogP, out.DEntropy, recomputed)
		sameGrads(t, b, grads, r.backward(out.DLogP, out.DEntropy, kept), "kept activations (bf16)")
		fusedGrads(t, b, dir, p, gpu.BF16, r.params(grads), out, 2e-2, "fused q/k/v projections (bf16)")
		sameGrads(t, b, grads, r.backward(out.DLogP, out.DEntropy, lean), "lean layers (bf16)")
		gotG := r.params(grads)
		wantG := readF32Safetensors(t, filepath.Join(dir, "grads.safetensors"))
		worst, worstName := 0.0, ""
		for name, want := range wantG {
			if e := relL2(gotG[name], want); e > worst {
				worst, worstName = e, name
			}
		}
		t.Logf("bf16 grads: max rel L2 %.3g (%s)", worst, worstName)
		if worst > gradTol {
			t.Errorf("bf16 grads: max rel L2 %.3g (%s) > %g", worst, worstName, gradTol)
		}
	})
}

// sameGrads fails t unless every unit's gradient in got has the bits of
// the one in want.
func sameGrads(t *testing.T, b gpu.Backend, want, got []gpu.Tensor, what string) {
	t.Helper()
	for i := range want {
		x, y := make([]byte, want[i].Bytes()), make([]byte, got[i].Bytes())
		if err := b.DownloadBytes(x, want[i]); err != nil {
			t.Fatal(err)
		}
		if err := b.DownloadBytes(y, got[i]); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Errorf("unit %d: gradients with %s differ from the reference run's", i, what)
		}
	}
}

// fusedGrads runs the model of dir laid out for one rank, where its q, k
// and v weights are adjacent (Config.FusedQKV; Qwen3 returns at once),
// forward at temperature 1 in dtype dt and backward from out's gradients
// with the fused projections, and checks its gradients against want (by
// parameter name), within a relative L2 error of tol per parameter: q, k
// and v are the same bits (the CPU's products sum each element in the same
// order whatever the matrix's width), but dxn is one sum where the
// separate products added three partial sums, rounded to the gradient
// dtype after each; cuBLASLt may also pick another algorithm for the wider
// products.
func fusedGrads(t *testing.T, b gpu.Backend, dir string, p packed, dt gpu.DType, want map[string][]float32, out rl.Output, tol float64, what string) {
	t.Helper()
	m := loadTestModelDP(t, newTestArena(t, b, 24<<20), dir, 1)
	if !m.c.FusedQKV(m.slots[1]) {
		if !m.c.QKNorm {
			t.Errorf("%s: a model without q/k norms does not fuse at dp 1", what)
		}
		return
	}
	r := newRun(t, newTestArena(t, b, 24<<20), m, p, dt, dt)
	r.forward(1)
	got := r.params(r.backward(out.DLogP, out.DEntropy, fused))
	worst := 0.0
	for name, w := range want {
		e := relL2(got[name], w)
		worst = max(worst, e)
		if e > tol {
			t.Errorf("%s: gradient with %s: rel L2 %.3g > %g", name, what, e, tol)
		}
	}
	t.Logf("%s: max rel L2 %.3g against the separate products", what, worst)
}

// TestLayout checks padded per-parameter layouts, including the tied
// head's appended embedding.
func TestLayout(t *testing.T) {
	tests := []struct {
		family  string
		dp      int
		unit    int // index into Units()
		names   []string
		padded  []int64
		offsets []int64
		elems   int64
		shard   int64
	}{
		{"qwen2", 3, -1, []string{"model.norm.weight", EmbedWeightName}, []int64{66, 258}, []int64{0, 66}, 66 + 258*64, 22},
		{"llama", 3, -1, []string{"model.norm.weight", "lm_head.weight"}, []int64{66, 258}, []int64{0, 66}, 66 + 258*64, 22 + 86*64},
		{"llama", 1, 0, []string{EmbedWeightName}, []int64{256}, []int64{0}, 256 * 64, 256 * 64},
		{"llama", 5, 1, nil, nil, nil, 0, 0},
		// A decoder layer with q/k/v and o_proj biases, in HF parameter
		// order; in the gathered buffer the q, k and v biases follow
		// v_proj.weight (FusedQKV).
		{"llama_bias", 1, 1, []string{
			"model.layers.0.input_layernorm.weight",
			"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias",
			"model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.k_proj.bias",
			"model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.v_proj.bias",
			"model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.o_proj.bias",
			"model.layers.0.post_attention_layernorm.weight",
			"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
		}, []int64{64, 64, 64, 32, 32, 32, 32, 64, 64, 64, 128, 128, 64},
			[]int64{0, 64, 8256, 4160, 8320, 6208, 8352, 8384, 12480, 12544, 12608, 20800, 28992}, 37184, 37184},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/dp%d/unit%d", tc.family, tc.dp, tc.unit), func(t *testing.T) {
			c, err := LoadConfig(filepath.Join("testdata", "hf", tc.family, "model"))
			if err != nil {
				t.Fatal(err)
			}
			units := c.Units()
			ui := tc.unit
			if ui < 0 {
				ui += len(units)
			}
			u := units[ui]
			slots := c.Layout(u, tc.dp)
			if tc.names != nil {
				if len(slots) != len(tc.names) {
					t.Fatalf("got %d slots, want %d", len(slots), len(tc.names))
				}
				for i, s := range slots {
					if s.Name != tc.names[i] || s.PaddedRows != tc.padded[i] || s.Offset != tc.offsets[i] {
						t.Errorf("slot %d = %s rows %d off %d, want %s rows %d off %d", i, s.Name, s.PaddedRows, s.Offset, tc.names[i], tc.padded[i], tc.offsets[i])
					}
				}
				if got := LayoutElems(slots); got != tc.elems {
					t.Errorf("LayoutElems = %d, want %d", got, tc.elems)
				}
				if got := LayoutShardElems(slots); got != tc.shard {
					t.Errorf("LayoutShardElems = %d, want %d", got, tc.shard)
				}
			}
			// General invariants: contiguous in the gathered buffer (in
			// gathered order) and in the shard (in slot order), padded to
			// dp, shard sizes.
			var off, shard int64
			d := int64(tc.dp)
			for _, k := range gatheredOrder(slots) {
				if s := slots[k]; s.Offset != off {
					t.Errorf("%s at offset %d, want %d", s.Name, s.Offset, off)
				}
				off += slots[k].PaddedElems()
			}
			for _, s := range slots {
				if s.ShardRows != (s.Rows()+d-1)/d || s.PaddedRows != d*s.ShardRows {
					t.Errorf("%s: shard rows %d, padded %d for %d rows", s.Name, s.ShardRows, s.PaddedRows, s.Rows())
				}
				if !s.Tied && s.ShardOffset != shard {
					t.Errorf("%s: shard offset %d, want %d", s.Name, s.ShardOffset, shard)
				}
				if !s.Tied {
					shard += s.ShardElems()
				}
			}
			var unpadded int64
			for _, p := range u.Params {
				unpadded += p.NumElements()
			}
			if tc.dp == 1 && u.Kind != UnitHead && LayoutElems(slots) != unpadded {
				t.Errorf("dp 1: %d elements, want %d", LayoutElems(slots), unpadded)
			}
		})
	}
}

// TestFusedQKV checks when a decoder layer's layout takes the fused q/k/v
// projection: q, k and v weights (and biases) adjacent and unpadded, no
// q/k norms.
func TestFusedQKV(t *testing.T) {
	tests := []struct {
		family string
		dp     int
		want   bool
	}{
		{"qwen2", 1, true},      // biases moved after v_proj.weight
		{"llama_bias", 1, true}, // with an o_proj bias too
		{"llama_bias", 2, true},
		{"llama_bias", 3, false}, // 64 q rows padded to 66
		{"llama", 1, true},       // no biases
		{"qwen3", 1, false},      // q/k norms
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/dp%d", tc.family, tc.dp), func(t *testing.T) {
			c, err := LoadConfig(filepath.Join("testdata", "hf", tc.family, "model"))
			if err != nil {
				t.Fatal(err)
			}
			u := c.Units()[1]
			if got := c.FusedQKV(c.Layout(u, tc.dp)); got != tc.want {
				t.Errorf("FusedQKV = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestFusedSpan checks the gathered span holding a decoder layer's q, k
// and v weights and biases: exactly their slots, whatever else the layer
// has; none for the embedding and the head.
func TestFusedSpan(t *testing.T) {
	for _, tc := range []struct {
		family string
		dp     int
	}{
		{"qwen2", 1}, {"llama_bias", 1}, {"llama_bias", 3}, {"llama", 1}, {"qwen3", 1},
	} {
		t.Run(fmt.Sprintf("%s/dp%d", tc.family, tc.dp), func(t *testing.T) {
			c, err := LoadConfig(filepath.Join("testdata", "hf", tc.family, "model"))
			if err != nil {
				t.Fatal(err)
			}
			us := c.Units()
			for _, u := range []Unit{us[0], us[len(us)-1]} {
				if lo, hi := FusedSpan(c.Layout(u, tc.dp)); lo != hi {
					t.Errorf("unit %s: span [%d, %d), want none", u.Kind, lo, hi)
				}
			}
			slots := c.Layout(us[1], tc.dp)
			lo, hi := FusedSpan(slots)
			var in int64
			for _, s := range slots {
				qkv := isQKV(s.Name, 0) || isQKV(s.Name, 1)
				if inside := s.Offset >= lo && s.Offset < hi; inside != qkv {
					t.Errorf("slot %s at %d: in [%d, %d) %v, want %v", s.Name, s.Offset, lo, hi, inside, qkv)
				}
				if qkv {
					in += s.PaddedElems()
				}
			}
			if hi-lo != in || in == 0 {
				t.Errorf("span [%d, %d) of %d elements, the q/k/v slots %d", lo, hi, hi-lo, in)
			}
		})
	}
}

// TestDecoderErrors checks that bad inputs are reported as errors.
func TestDecoderErrors(t *testing.T) {
	dir := filepath.Join("testdata", "hf", "qwen3")
	b := cpu.New()
	a := newTestArena(t, b, 8<<20)
	m := loadTestModel(t, a, dir)
	c := m.c
	w, err := c.LayerWeightsFrom(m.units[1], m.slots[1], m.master[1])
	if err != nil {
		t.Fatal(err)
	}
	const tt = 4
	acts := newActs(a, c, tt, gpu.F32)
	in := a.tensor(gpu.F32, tt, c.HiddenSize)
	batch := Batch{Positions: a.i32([]int32{0, 1, 0, 1}), CuSeqlens: a.i32([]int32{0, 2, 4}), T: tt}
	if err := c.LayerForward(b, w, &acts, in, in, batch); err != nil {
		t.Fatalf("valid forward: %v", err)
	}
	noQRaw := acts
	noQRaw.QRaw = gpu.Tensor{}
	noNorm := w
	noNorm.QNorm = gpu.Tensor{}
	withQKV := acts // Qwen3's q/k norms do not take the fused projection
	withQKV.QKV = a.tensor(gpu.F32, tt, (c.NumHeads+2*c.NumKVHeads)*c.HeadDim)
	idx := a.i32([]int32{0, 9})
	dst := a.tensor(gpu.F32, 2, c.HiddenSize)
	tests := []struct {
		name string
		run  func() error
	}{
		{"missing q_raw", func() error { return c.LayerForward(b, w, &noQRaw, in, in, batch) }},
		{"missing q_norm", func() error { return c.LayerForward(b, noNorm, &acts, in, in, batch) }},
		{"nil acts", func() error { return c.LayerForward(b, w, nil, in, in, batch) }},
		{"fused q/k/v with q/k norms", func() error {
			if err := c.LayerForward(b, w, &withQKV, in, in, batch); !errors.Is(err, errFusedQKNorm) {
				return nil
			}
			return errFusedQKNorm
		}},
		{"bad T", func() error {
			return c.LayerForward(b, w, &acts, in, in, Batch{Positions: batch.Positions, CuSeqlens: batch.CuSeqlens, T: 3})
		}},
		{"wrong unit", func() error { _, err := c.LayerWeightsFrom(m.units[0], m.slots[0], m.master[0]); return err }},
		{"short buffer", func() error { _, err := c.LayerWeightsFrom(m.units[1], m.slots[1], a.tensor(gpu.F32, 10)); return err }},
		{"mismatched slots", func() error { _, err := c.LayerWeightsFrom(m.units[1], m.slots[2], m.master[1]); return err }},
		{"head from layer", func() error { _, err := c.HeadWeightsFrom(m.units[1], m.slots[1], m.master[1]); return err }},
		{"select out of range", func() error { return SelectRows(b, dst, in, idx) }},
		{"scatter out of range", func() error { return ScatterAddRows(b, in, dst, idx) }},
		{"select row mismatch", func() error { return SelectRows(b, a.tensor(gpu.F32, 3, c.HiddenSize), in, idx) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(); err == nil {
				t.Error("no error")
			}
		})
	}
}

// TestSlidingWindowCheck checks that sequences longer than the sliding
// window are refused.
func TestSlidingWindowCheck(t *testing.T) {
	dir := filepath.Join("testdata", "hf", "mistral")
	b := cpu.New()
	a := newTestArena(t, b, 8<<20)
	m := loadTestModel(t, a, dir)
	c := *m.c
	c.SlidingWindow = 3
	w, err := c.LayerWeightsFrom(m.units[1], m.slots[1], m.master[1])
	if err != nil {
		t.Fatal(err)
	}
	const tt = 5
	acts := newActs(a, &c, tt, gpu.F32)
	in := a.tensor(gpu.F32, tt, c.HiddenSize)
	pos := a.i32([]int32{0, 1, 2, 0, 1})
	tests := []struct {
		name string
		cu   []int32
		ok   bool
	}{
		{"within window", []int32{0, 3, 5}, true},
		{"longer than window", []int32{0, 1, 5}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := c.LayerForward(b, w, &acts, in, in, Batch{Positions: pos, CuSeqlens: a.i32(tc.cu), T: tt})
			if (err == nil) != tc.ok {
				t.Errorf("err = %v, want ok %v", err, tc.ok)
			}
		})
	}
}
