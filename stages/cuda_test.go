//go:build cgo

package stages

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cuda"
	"github.com/rlpipe/rlpipe/gpu/nvml"
	"github.com/rlpipe/rlpipe/nccl"
	"github.com/rlpipe/rlpipe/nccl/libnccl"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/engines/enginetest"
)

// TestRunTinyCUDA runs the embedded default on GPU 0 and holds it to the CPU
// run: the same metrics (fp32: 1e-4 relative; the GPU's GEMMs, attention and
// log-probs sum in another order), the arena's high-water mark equal to the
// plan's peak, and the NVML-measured process memory within the plan's device
// total (arena + reserves). It skips, saying why, without a CUDA driver.
func TestRunTinyCUDA(t *testing.T) {
	if _, err := cuda.Versions(); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			t.Skipf("cuda: no driver, GPU test skipped: %v", err)
		}
		t.Fatal(err)
	}
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	const steps = 4
	for _, tc := range []struct {
		name     string
		policies map[string]string // policy key -> expression
		relTol   float64
	}{
		{"on device fp32", map[string]string{"precision": `"fp32"`}, 1e-4},
		// Params and optimizer state in pinned memory: units stream to the
		// GPU on the side stream.
		{"offloaded fp32", map[string]string{"precision": `"fp32"`, "offload": "true", "offload_optimizer": "model.trainable"}, 1e-4},
		// The optimizer state alone in pinned memory: the GPU steps each
		// unit through device staging buffers (with offload too, the step
		// runs on the host's cores instead).
		{"optimizer offloaded fp32", map[string]string{"precision": `"fp32"`, "offload_optimizer": "model.trainable"}, 1e-4},
		// bf16 with offload casts the streamed shards on the side stream,
		// so the staging buffers must outlive the asynchronous gather. The
		// GPU and the CPU round bf16 sums in other orders: 2e-2.
		{"offloaded bf16", map[string]string{"precision": `"bf16"`, "offload": "true", "offload_optimizer": "model.trainable"}, 2e-2},
		// As "offloaded fp32", with the stream that stages each unit's
		// grads held back for 5 ms first: copies to the host that do not
		// wait for that stream take stale grads.
		{"offloaded fp32, staging delayed", map[string]string{"precision": `"fp32"`, "offload": "true", "offload_optimizer": "model.trainable"}, 1e-4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.HasSuffix(tc.name, "staging delayed") {
				defer func() { stagingHook = nil }()
				stagingHook = delayStream
			}
			short := func(s *spec.Spec) {
				s.Train.Steps = steps
				setPolicies(t, s, tc.policies)
			}
			checkCUDARun(t, path, short, tc.relTol, 1, 1)
		})
	}
}

// TestHostBF16CUDA is TestHostBF16SameBits on GPU 0: the offloaded bf16
// actor's gathers from the host's bf16 copy, and from the fp32 masters
// cast on the device, give the same bits.
func TestHostBF16CUDA(t *testing.T) {
	if _, err := cuda.Versions(); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			t.Skipf("cuda: no driver, GPU test skipped: %v", err)
		}
		t.Fatal(err)
	}
	testHostBF16SameBits(t, RunOptions{Backend: func(rank int) (gpu.Backend, error) { return cuda.New(rank) }}, 1)
}

// delayStream holds a CUDA backend's stream back for 5 ms (cuda.Backend's
// Delay); on the CPU, where every op completes before it returns, it does
// nothing.
func delayStream(b gpu.Backend, _ gpu.Tensor) error {
	if d, ok := b.(interface{ Delay(time.Duration) error }); ok {
		return d.Delay(5 * time.Millisecond)
	}
	return nil
}

// TestRunTinyCUDADP2 runs the embedded default with dp 2 on GPUs 0 and 1,
// connected by NCCL, and holds it to the CPU run with dp 2 (loopback), as
// TestRunTinyCUDA does for one GPU: on the device, and with params and
// optimizer offloaded in bf16 (gathers on the side stream) and in fp32 with
// the side stream delayed before each reduction. It skips, saying why,
// without two GPUs or NCCL.
func TestRunTinyCUDADP2(t *testing.T) {
	needGPUs(t, 2, "dp 2")
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	compile := func(src string, kind reflect.Kind) *spec.Expr {
		e, err := spec.Compile(src, spec.Pos{File: "test"}, kind)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	for _, tc := range []struct {
		name    string
		offload bool
		prec    string
		relTol  float64
		delay   bool // stagingHook holds the side stream back before each unit's reduce-scatter
	}{
		{"on device fp32", false, `"fp32"`, 1e-4, false},
		{"offloaded bf16", true, `"bf16"`, 2e-2, false},
		// The side stream reduce-scatters each unit's grads and the Down
		// stream copies the shards to the host: it must wait for the side
		// stream, held back here by 5 ms first.
		{"offloaded fp32, staging delayed", true, `"fp32"`, 1e-4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.delay {
				defer func() { stagingHook = nil }()
				stagingHook = delayStream
			}
			short := func(s *spec.Spec) {
				s.Train.Steps = 4
				s.Mesh.GPUsPerNode, s.Mesh.DP = 2, 2
				s.Policies.Precision = compile(tc.prec, reflect.String)
				if tc.offload {
					s.Policies.Offload = compile("true", reflect.Bool)
					s.Policies.OffloadOptimizer = compile("model.trainable", reflect.Bool)
				}
			}
			checkCUDARun(t, path, short, tc.relTol, 2, 1)
		})
	}
}

// TestRunTinyCUDACP2 runs the tiny job with every sequence split over two
// GPUs (dp 1 × cp 2: ring attention through NCCL sends and receives, the
// span kernels) and compares it with the CPU, fp32 and bf16. It needs two
// GPUs and NCCL, and skips saying so otherwise.
func TestRunTinyCUDACP2(t *testing.T) {
	needGPUs(t, 2, "cp 2")
	path := filepath.Join("..", "examples", "tiny-grpo.yaml")
	for _, tc := range []struct {
		prec   string
		relTol float64
	}{{`"fp32"`, 1e-4}, {`"bf16"`, 2e-2}} {
		t.Run(tc.prec, func(t *testing.T) {
			short := func(s *spec.Spec) {
				s.Train.Steps = 4
				s.Mesh.GPUsPerNode, s.Mesh.DP, s.Mesh.CP = 2, 1, 2
				e, err := spec.Compile(tc.prec, spec.Pos{File: "test"}, reflect.String)
				if err != nil {
					t.Fatal(err)
				}
				s.Policies.Precision = e
			}
			checkCUDARun(t, path, short, tc.relTol, 2, 2)
		})
	}
}

// needGPUs skips the test (named what) unless the host has n GPUs and
// NCCL.
func needGPUs(t *testing.T, n int, what string) {
	t.Helper()
	info, err := cuda.Versions()
	if err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			t.Skipf("cuda: no driver, GPU test skipped: %v", err)
		}
		t.Fatal(err)
	}
	if len(info.Devices) < n {
		t.Skipf("cuda: %d GPU(s), the %s test needs %d", len(info.Devices), what, n)
	}
	if _, err := libnccl.Load(); err != nil {
		t.Skipf("nccl not available, %s GPU test skipped: %v", what, err)
	}
}

// checkCUDARun runs the spec at path on the CPU and on GPUs 0..ranks-1
// (NCCL between them when ranks > 1; with cp > 1 a communicator per cp
// group) and compares.
func checkCUDARun(t *testing.T, path string, short func(*spec.Spec), relTol float64, ranks, cp int) {
	t.Helper()
	cpuRun := runSpec(t, path, short)
	var nvmlPeak int64
	var comms, cpComms func([]gpu.Backend) ([]nccl.Comm, error)
	if ranks > 1 {
		comms = libnccl.NewComms
	}
	if cp > 1 {
		cpComms = func(bs []gpu.Backend) ([]nccl.Comm, error) { return libnccl.NewGroups(bs, cp) }
	}
	gpuRun := runSpecWith(t, path, short, RunOptions{
		Backend: func(rank int) (gpu.Backend, error) { return cuda.New(rank) },
		Comms:   comms,
		CPComms: cpComms,
		AfterStep: func(r *Rank, _ StepResult) error {
			if n, err := nvml.ProcessMemory(0); err == nil && n > nvmlPeak {
				nvmlPeak = n
			}
			return nil
		},
	})
	for r, hw := range gpuRun.peak {
		if hw != gpuRun.plan {
			t.Errorf("rank %d: arena high-water %d, plan peak %d", r, hw, gpuRun.plan)
		}
	}
	for i, sr := range gpuRun.steps {
		want := cpuRun.steps[i]
		for _, k := range []string{"loss", "kl_loss", "entropy_loss", "adv_logp"} {
			got, w := sr.Stats.Values[k], want.Stats.Values[k]
			if d := math.Abs(got - w); d > relTol*math.Max(math.Abs(w), 1e-2) {
				t.Errorf("step %d: %s = %.8g on the GPU, %.8g on the CPU", sr.Step, k, got, w)
			}
		}
		if d := math.Abs(sr.Stats.GradNorm - want.Stats.GradNorm); d > relTol*want.Stats.GradNorm {
			t.Errorf("step %d: grad_norm = %.8g on the GPU, %.8g on the CPU", sr.Step, sr.Stats.GradNorm, want.Stats.GradNorm)
		}
	}
	if nvmlPeak == 0 {
		t.Logf("nvml: no per-process figure for this process (containers often hide the pid)")
	} else {
		t.Logf("nvml: process memory %d bytes; plan device total %d (arena %d + reserves)", nvmlPeak, gpuRun.total, gpuRun.arena)
		if nvmlPeak > gpuRun.total {
			t.Errorf("NVML process memory %d exceeds the plan's device total %d", nvmlPeak, gpuRun.total)
		}
	}
}

// TestSleepWakeCUDA runs the colocated live loop (an SGLang test engine) on
// GPU 0 for 3 steps and holds it to the same recipe without sleep and wake
// on the GPU: the same losses (bit for bit where the GPU's kernels are
// deterministic; within 1e-6 relative otherwise). While asleep, the
// NVML-measured process memory must be within the plan's asleep device
// bytes (the resident arena and the CUDA context), or, where earlier tests
// of the process (or the run without sleep) left memory on the GPU, within
// that memory and the resident arena; it logs sleep and wake seconds and GB/s. It skips
// without a CUDA driver.
func TestSleepWakeCUDA(t *testing.T) {
	if _, err := cuda.Versions(); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			t.Skipf("cuda: no driver, GPU test skipped: %v", err)
		}
		t.Fatal(err)
	}
	run := func(sleepWake bool) ([]StepResult, *plan.Plan) {
		srv := enginetest.NewSGLang(fakePolicy)
		defer srv.Close()
		s := colocated(t, srv.URL, t.TempDir(), 3, sleepWake)
		j := resolveSpec(t, s)
		p, err := Plan(j)
		if err != nil {
			t.Fatal(err)
		}
		var steps []StepResult
		_, err = Run(context.Background(), j, p, RunOptions{
			Backend: func(rank int) (gpu.Backend, error) { return cuda.New(rank) },
			DeviceMemory: func(rank int) (int64, bool) {
				n, err := nvml.ProcessMemory(rank)
				return n, err == nil
			},
			AfterStep: func(r *Rank, sr StepResult) error {
				steps = append(steps, sr)
				return nil
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		return steps, p
	}
	// Memory that earlier tests of this process left on GPU 0 is not this
	// run's: after TestRunTinyCUDADP2 (its NCCL communicators) the process
	// holds 392 MB more on an H200 of four, with or without this test's
	// runs (bench/results/2026-11-28-x4-best/call5). The asleep figure may
	// then reach that much plus the plan's resident arena in whole 2 MiB
	// pages (NVML counts the driver's pages: 2 MiB over for an arena of
	// 8,960 bytes, call6); in a process of its own the bound is the plan's
	// asleep bytes. What the process holds is read after the run without
	// sleep, which has freed its arena but not what the process keeps
	// once it has run a kernel (the driver may load kernels' code at their
	// first launch): read before that run, the bound was 2 MiB short on
	// two H200s after the two-GPU tests (bench/results/
	// 2026-11-28-memory-bound, call 4; call 5 passes with the same asleep
	// figure). What the 2 MiB were was not traced.
	const page = 2 << 20
	awake, _ := run(false)
	before, err := nvml.ProcessMemory(0)
	if err != nil {
		before = 0
	}
	asleep, p := run(true)
	arena := (p.ResidentArena + page - 1) / page * page
	bound := max(p.AsleepDeviceBytes(), before+arena)
	for i, sr := range asleep {
		got, want := sr.Stats.Values["loss"], awake[i].Stats.Values["loss"]
		if got != want {
			t.Logf("step %d: loss %.10g with sleep and wake, %.10g without", sr.Step, got, want)
			if math.Abs(got-want) > 1e-6*math.Max(math.Abs(want), 1e-2) {
				t.Errorf("step %d: loss %.10g with sleep and wake, %.10g without", sr.Step, got, want)
			}
		}
		v := sr.Stats.Values
		t.Logf("step %d: sleep %.4f s (%.3g GB, %.3g GB/s), wake %.4f s (%.3g GB/s); asleep: NVML %v bytes, plan %d",
			sr.Step, v["sleep_s"], v["sleep_gb"], v["sleep_gbps"], v["wake_s"], v["wake_gbps"], v["asleep_device_bytes"], p.AsleepDeviceBytes())
		if n, ok := v["asleep_device_bytes"]; ok && n > float64(bound) {
			t.Errorf("step %d: NVML shows %v bytes while asleep, more than the plan's %d (or %d held before the test plus the resident arena's %d in pages)",
				sr.Step, n, p.AsleepDeviceBytes(), before, arena)
		}
	}
}

// TestTiedRowsCUDA is TestTiedRows on GPU 0, without the run on the device
// (whose AdamW and sums of squares are the device's): the touched rows
// cross into pinned host memory from a kernel (CopyRows).
func TestTiedRowsCUDA(t *testing.T) {
	if _, err := cuda.Versions(); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			t.Skipf("cuda: no driver, GPU test skipped: %v", err)
		}
		t.Fatal(err)
	}
	testTiedRows(t, RunOptions{Backend: func(rank int) (gpu.Backend, error) { return cuda.New(rank) }}, false)
}

// TestEarlyUpdateCUDA is TestEarlyUpdate on GPU 0, without the run on the
// device (whose AdamW is the device's): the early updater polls the Down
// stream's events (waitOff) while the rank issues the backward.
func TestEarlyUpdateCUDA(t *testing.T) {
	if _, err := cuda.Versions(); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			t.Skipf("cuda: no driver, GPU test skipped: %v", err)
		}
		t.Fatal(err)
	}
	opts := RunOptions{Backend: func(rank int) (gpu.Backend, error) { return cuda.New(rank) }}
	testEarlyUpdate(t, opts, false, 1)
	defer func(v bool) { tiedRowsOn = v }(tiedRowsOn)
	tiedRowsOn = false // the embedding's grads through the host's adds
	testEarlyUpdate(t, opts, false, 1)
}

// TestGradAccumulationCUDA is TestGradAccumulation on GPU 0, without the
// run on the device (whose AdamW is the device's): the sums on the device
// against the host's adds of the later micro-batches' grads.
func TestGradAccumulationCUDA(t *testing.T) {
	if _, err := cuda.Versions(); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			t.Skipf("cuda: no driver, GPU test skipped: %v", err)
		}
		t.Fatal(err)
	}
	testGradAccumulation(t, RunOptions{Backend: func(rank int) (gpu.Backend, error) { return cuda.New(rank) }}, false, 1)
}

// TestGatherOnceCUDA is TestGatherOnce on GPU 0.
func TestGatherOnceCUDA(t *testing.T) {
	if _, err := cuda.Versions(); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			t.Skipf("cuda: no driver, GPU test skipped: %v", err)
		}
		t.Fatal(err)
	}
	testGatherOnce(t, RunOptions{Backend: func(rank int) (gpu.Backend, error) { return cuda.New(rank) }}, 1)
}

// TestEarlyUpdateCUDADP2 is TestEarlyUpdate on GPUs 0 and 1 (NCCL): the
// tied embedding's grads reach the host through the host's adds, which
// its early AdamW waits for. It needs two GPUs and NCCL.
func TestEarlyUpdateCUDADP2(t *testing.T) {
	needGPUs(t, 2, "dp 2")
	testEarlyUpdate(t, RunOptions{Backend: func(rank int) (gpu.Backend, error) { return cuda.New(rank) }, Comms: libnccl.NewComms}, false, 2)
}

// TestReplicateCUDADP2 runs the tiny job on two GPUs (NCCL) with its
// frozen ref replicated and sharded, bf16: without update_ref, and with
// update_ref after every step (which gathers the actor into the replica).
// The replica's metrics must equal the sharded run's to the bit (the same
// kernels on the same weights, read in place instead of gathered), within
// 2e-2 of the CPU's, with the plan's peak the arena's high-water mark; and
// synced every step, the ref's KL is about 0. It needs two GPUs and
// NCCL, and skips saying so otherwise.
func TestReplicateCUDADP2(t *testing.T) {
	needGPUs(t, 2, "replicate at dp 2")
	bf16 := func(s *spec.Spec) {
		s.Train.Steps = 3
		e, err := spec.Compile(`"bf16"`, spec.Pos{File: "test"}, reflect.String)
		if err != nil {
			t.Fatal(err)
		}
		s.Policies.Precision = e
	}
	onGPU := RunOptions{Backend: func(rank int) (gpu.Backend, error) { return cuda.New(rank) }, Comms: libnccl.NewComms}
	for _, c := range []struct {
		name string
		job  func(v string) *spec.Spec
	}{{"no update_ref", func(v string) *spec.Spec { return noSyncRef(t, v) }}, {"update_ref every step", func(v string) *spec.Spec { return syncedRef(t, v) }}} {
		t.Run(c.name, func(t *testing.T) {
			cpuRun := runParsed(t, c.job("true"), bf16, nil, RunOptions{})
			sharded := runParsed(t, c.job("false"), bf16, nil, onGPU)
			replica := runParsed(t, c.job("true"), bf16, nil, onGPU)
			sameAsSharded(t, sharded, replica)
			for i, sr := range replica.steps {
				cr := cpuRun.steps[i]
				for _, k := range []string{"loss", "kl_loss", "entropy_loss", "adv_logp"} {
					if got, w := sr.Stats.Values[k], cr.Stats.Values[k]; math.Abs(got-w) > 2e-2*math.Max(math.Abs(w), 1e-2) {
						t.Errorf("step %d: %s = %.8g on the GPU, %.8g on the CPU", sr.Step, k, got, w)
					}
				}
				// The train stage's forward and ref_logprob's may round
				// apart on the GPU; a stale ref gives about 5e-3 (the CPU).
				if kl := sr.Stats.Values["kl_loss"]; c.name != "no update_ref" && math.Abs(kl) > 1e-4 {
					t.Errorf("step %d: kl_loss %v with the ref synced every step, want about 0", sr.Step, kl)
				}
			}
		})
	}
}
