package stages

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
)

// resolveFile loads a spec file and resolves it for planning: its models
// need no weights and its rollout file need not exist.
func resolveFile(t *testing.T, path string) *Job {
	t.Helper()
	s, err := spec.Load(path)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	j, err := Resolve(s, testGPU, CheckPlan)
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	return j
}

func opIndex(t *testing.T, p *plan.Plan, stage, name string) int {
	t.Helper()
	for _, o := range p.Ops {
		if o.Stage == stage && o.Name == name {
			return o.Index
		}
	}
	t.Fatalf("no op %q in stage %q", name, stage)
	return -1
}

// The tiny Qwen2 config: H=8, I=16, L=2, Hq=2, Hkv=1, D=4, V=32, q/k/v bias,
// untied. Parameter elements, counted by hand:
//
//	embed  32*8                                   = 256
//	layer  8 (norm1) + 64+8 (q) + 32+4 (k) + 32+4 (v) + 64 (o)
//	       + 8 (norm2) + 128+128+128 (gate, up, down) = 608
//	head   8 (norm) + 32*8 (lm_head)              = 264
//	total  256 + 2*608 + 264                      = 1736
const tinyParams = 1736

func TestPlanTinyByHand(t *testing.T) {
	j := resolveFile(t, filepath.Join("testdata", "tiny.yaml"))
	p, err := Plan(j)
	if err != nil {
		t.Fatal(err)
	}
	al := plan.AlignUp
	// Each unit's shard is its own 256-byte-aligned section of the model's
	// buffer: fp32 sections of 1024 (embed), 2432 -> 2560 (each layer) and
	// 1056 -> 1280 (head) bytes; bf16 sections of 512, 1216 -> 1280 and
	// 528 -> 768.
	fp32Shards := int64(1024 + 2*2560 + 1280)
	bf16Shards := int64(512 + 2*1280 + 768)
	if fp32Shards < al(4*tinyParams) {
		t.Fatal("aligned sections cannot be smaller than the packed parameters")
	}
	want := map[string]int64{
		// trainable actor: fp32 master, m, v
		"actor.params": fp32Shards, "actor.adam_m": fp32Shards, "actor.adam_v": fp32Shards,
		// its fp32 grads, a buffer a unit, through the update
		"train.grads.embed": 1024, "train.grads.layer0": 2560, "train.grads.layer1": 2560, "train.grads.head": 1280,
		// frozen ref keeps its shards in the compute dtype (bf16 by default)
		"ref.params": bf16Shards,
		// on one rank the frozen ref reads its bf16 shards in place and
		// copies only the fused projection's q, k and v weights and
		// biases, 64+8 + 32+4 + 32+4 = 144 values (inPlace); the actor,
		// whose fp32 master is cast, gathers whole bf16 units
		"ref.gathered.layer0": al(2 * 144), "train.gathered.layer0": al(2 * 608),
		// one logits chunk: 4 tokens x 32 vocab x fp32
		"ref.head.logits": 4 * 4 * 32, "train.head.logits": 4 * 4 * 32,
		// fp32 residual stream of 16 tokens x 8
		"ref.resid.embed": 4 * 16 * 8,
		// the batch's per-token log-probs, shared over the ranks: up to
		// 4 samples x 8 tokens, fp32
		"ref.values": al(4 * 8 * 4),
		// cu_seqlens for up to 16 sequences
		"ref.io.cu_seqlens": al(4 * 17),
		// the unsharded bf16 grad of a decoder unit
		"train.grad.layer1": al(2 * 608),
	}
	for _, name := range []string{"ref.gathered.embed", "ref.gathered.head"} {
		if b := p.Buffer(name); b != nil {
			t.Errorf("%s = %d bytes, want none: the ref's embedding and head are read in place", name, b.Bytes)
		}
	}
	for name, bytes := range want {
		b := p.Buffer(name)
		if b == nil {
			t.Errorf("no buffer %q", name)
			continue
		}
		if b.Bytes != bytes {
			t.Errorf("%s = %d bytes, want %d", name, b.Bytes, bytes)
		}
	}

	if b := p.Buffer("actor.grads"); b != nil {
		t.Errorf("actor.grads = %d bytes, want none: the device grads live through an update", b.Bytes)
	}

	// Everything live during ref's "layer0 qkv" op, by hand:
	//   actor params, m, v                      3 x 7424
	//   ref params                              3840
	//   io: ids, positions, cu_seqlens, targets, logit_pos, logp  6 x 256
	//   the batch's log-probs                   256
	//   gathered layer0 and prefetched layer1   2 x 512 (q/k/v only)
	//   fp32 residual                           512
	//   xn (bf16 16x8), q (16x8), k, v (16x4)   4 x 256
	//   the fused projection's output (16x16)   512
	op := opIndex(t, p, "ref", "layer0 qkv")
	wantLive := 3*fp32Shards + bf16Shards + 6*256 + 256 + 2*512 + 512 + 4*256 + 512
	if got, _ := p.LiveBytes(op, false); got != wantLive {
		t.Errorf("live at ref layer0 qkv = %d, want %d", got, wantLive)
	}

	// Activation checkpointing (the spec's recompute is true): the train
	// forward keeps only each decoder layer's fp32 input until its backward.
	for _, n := range []string{"train.resid.embed", "train.resid.layer0"} {
		b := p.Buffer(n)
		if b == nil || b.Bytes != 4*16*8 {
			t.Fatalf("%s = %+v, want a 512-byte saved input", n, b)
		}
	}
	if b := p.Buffer("train.saved.layer0.xn"); b != nil {
		t.Errorf("recomputed layer keeps %s", b.Name)
	}
	if b := p.Buffer("train.rc.layer0.gate"); b == nil || b.Bytes != al(2*16*16) {
		t.Errorf("recompute buffer train.rc.layer0.gate = %+v, want %d bytes", b, al(2*16*16))
	}
	saved := p.Buffer("train.resid.embed")
	if bwd := opIndex(t, p, "train", "layer0 norm1 backward"); saved.End < bwd {
		t.Errorf("layer0's input dies at op %d, before its backward at %d", saved.End, bwd)
	}
	checkInvariants(t, p)
}

// checkInvariants checks what every plan must satisfy: live buffers never
// share bytes, the arena holds the peak, and the peak is the max live bytes.
func checkInvariants(t *testing.T, p *plan.Plan) {
	t.Helper()
	var peak int64
	for i := range p.Ops {
		if n, _ := p.LiveBytes(i, false); n > peak {
			peak = n
		}
	}
	if peak != p.PeakBytes {
		t.Errorf("PeakBytes = %d, max live = %d", p.PeakBytes, peak)
	}
	if p.DeviceArena < p.PeakBytes {
		t.Errorf("arena %d smaller than peak %d", p.DeviceArena, p.PeakBytes)
	}
	for i, a := range p.Buffers {
		if a.Bytes == 0 {
			continue
		}
		if a.Offset+a.Bytes > map[bool]int64{false: p.DeviceArena, true: p.HostArena}[a.Host] {
			t.Errorf("%s ends past its arena", a.Name)
		}
		for _, b := range p.Buffers[i+1:] {
			if a.Host != b.Host || b.Bytes == 0 {
				continue
			}
			if a.Start <= b.End && b.Start <= a.End && a.Offset < b.Offset+b.Bytes && b.Offset < a.Offset+a.Bytes {
				t.Errorf("%s and %s are live together and overlap", a.Name, b.Name)
			}
		}
	}
}

func TestPlanPolicies(t *testing.T) {
	tests := []struct {
		name     string
		policies string
		check    func(t *testing.T, p *plan.Plan)
	}{
		{"offload ref", `offload: 'model.role == "ref"'`, func(t *testing.T, p *plan.Plan) {
			if b := p.Buffer("ref.params"); !b.Host {
				t.Error("ref params not on host")
			}
			if b := p.Buffer("ref.h2d.layer0"); b == nil || b.Bytes != plan.AlignUp(2*608) {
				t.Errorf("ref.h2d.layer0 = %+v, want a bf16 shard staging buffer", b)
			}
		}},
		{"offload optimizer", `offload_optimizer: 'model.trainable'`, func(t *testing.T, p *plan.Plan) {
			for _, n := range []string{"actor.grads", "actor.adam_m", "actor.adam_v"} {
				if !p.Buffer(n).Host {
					t.Errorf("%s not on host", n)
				}
			}
			if p.Buffer("actor.params").Host {
				t.Error("actor params offloaded without the offload policy")
			}
			if b := p.Buffer("train.opt.stage.m"); b == nil {
				t.Error("no optimizer staging buffer")
			}
		}},
		{"offload params and optimizer", "offload: 'model.trainable'\n  offload_optimizer: 'model.trainable'", func(t *testing.T, p *plan.Plan) {
			for _, n := range []string{"actor.params", "actor.grads", "actor.adam_m", "actor.adam_v"} {
				if !p.Buffer(n).Host {
					t.Errorf("%s not on host", n)
				}
			}
			// The optimizer step runs on the host: no device staging.
			for _, n := range []string{"grad", "m", "v", "param"} {
				if b := p.Buffer("train.opt.stage." + n); b != nil {
					t.Errorf("train.opt.stage.%s declared for a host optimizer step", n)
				}
			}
		}},
		{"fp32 head", `precision: 'layer.kind == "head" ? "fp32" : "bf16"'`, func(t *testing.T, p *plan.Plan) {
			// The fp32 head's shard (the ref's, and the actor's fp32
			// master) is read in place; the actor's bf16 layers are cast
			// into whole gathered units, the ref's copy their q/k/v span.
			for _, n := range []string{"ref.gathered.head", "train.gathered.head"} {
				if b := p.Buffer(n); b != nil {
					t.Errorf("%s = %d bytes, want none (read in place)", n, b.Bytes)
				}
			}
			for n, want := range map[string]int64{"train.gathered.layer0": plan.AlignUp(2 * 608), "ref.gathered.layer0": plan.AlignUp(2 * 144)} {
				if b := p.Buffer(n); b == nil || b.Bytes != want {
					t.Errorf("%s = %+v, want %d bytes", n, b, want)
				}
			}
		}},
		{"no recompute", `recompute: 'false'`, func(t *testing.T, p *plan.Plan) {
			if b := p.Buffer("train.saved.layer0.gate"); b == nil || b.Bytes != plan.AlignUp(2*16*16) {
				t.Errorf("train.saved.layer0.gate = %+v", b)
			}
			if b := p.Buffer("train.rc.layer0.gate"); b != nil {
				t.Error("recompute buffer declared with recompute off")
			}
		}},
		{"element-wise layers", "recompute: 'false'\n  recompute_elementwise: 'layer.index == 1'", func(t *testing.T, p *plan.Plan) {
			// Layer 1 keeps gate and up but not xn, xn2 and act; its
			// backward recomputes act into dgate. Layer 0 keeps
			// everything. In both, dgate (which takes dy·W_down, or which
			// a backend writes with dup from dy in one op) and dup are
			// live from the down backward on, and dy·W_down has no buffer
			// of its own.
			for _, n := range []string{"xn", "xn2", "act", "gate", "up"} {
				want := n == "gate" || n == "up"
				if b := p.Buffer("train.saved.layer1." + n); (b != nil) != want {
					t.Errorf("train.saved.layer1.%s declared: %v, want %v", n, b != nil, want)
				}
				if b := p.Buffer("train.saved.layer0." + n); b == nil {
					t.Errorf("train.saved.layer0.%s not declared", n)
				}
			}
			for layer := range 2 {
				for _, n := range []string{"dgate", "dup"} {
					b := p.Buffer(fmt.Sprintf("train.bwd.layer%d.%s", layer, n))
					if b == nil || !strings.HasSuffix(p.Ops[b.Start].Name, "down backward") {
						t.Errorf("train.bwd.layer%d.%s = %+v, want it live from the down backward", layer, n, b)
					}
				}
				if b := p.Buffer(fmt.Sprintf("train.bwd.layer%d.dact", layer)); b != nil {
					t.Errorf("train.bwd.layer%d.dact declared: %+v", layer, b)
				}
			}
		}},
	}
	base := readFile(t, filepath.Join("testdata", "tiny.yaml"))
	const written = "policies:\n  recompute: 'true' # TestPlanTinyByHand counts the recompute buffers\n"
	if !strings.Contains(base, written) {
		t.Fatalf("testdata/tiny.yaml has no %q", written)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := strings.Replace(base, written, "policies:\n  "+tt.policies+"\n", 1)
			path := writeTemp(t, "tiny.yaml", src)
			j := resolveFile(t, path)
			p, err := Plan(j)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, p)
			checkInvariants(t, p)
		})
	}
}
