package bench

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages"
)

// TestScaleDevicePlans checks, without a GPU, what bench/scale_device.sh
// will run on the 2-, 4- and 8-GPU H200 machines. For each world (W = 8, 4
// and 2) it runs the script with SCALE_DRY=1, which writes every spec it would
// run and prints every command, and then:
//
//   - plans every spec written on h200-141g: each names that GPU in
//     mesh.gpu (so `rlpipe plan` on the device, whose JSON the summary
//     compares the run against, gives this plan), fits the GPU and the
//     node's RAM, except the cp 1 specs of the long samples (the cp
//     phase's, and the long phase's examples/qwen2.5-1.5b-long-cp2.yaml
//     at 524,288 tokens), which must not fit (the reason for cp 2 and 4);
//     its arena is within 2% of its peak;
//   - plans every rlbench command it prints (the flags parsed as rlbench
//     parses them) as rlbench --plan-only: each fits, and above dp 1 its
//     reserves are dp 1's plus the NCCL reserve that the summary's NCCL
//     figure is compared against, the same constant as stages.NCCLReserve;
//   - checks that the spec of the benchmark recipe, which process-per-GPU
//     runs run through `rlpipe run`, plans as rlbench's job at the same dp
//     (peak, arena and reserves equal: the marks declare no buffers).
//
// The 8-GPU examples are planned on h200-141g at dp 8 and dp 4 too.
func TestScaleDevicePlans(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash to run bench/scale_device.sh")
	}
	script := readScaleScript(t)
	if !strings.Contains(script, "NCCL_RESERVE = "+strconv.Itoa(stages.NCCLReserve>>20)+" << 20") {
		t.Errorf("scale_device.sh's summary compares NCCL memory against another reserve than stages.NCCLReserve (%d MiB)", stages.NCCLReserve>>20)
	}
	tests := []struct {
		world   int
		rlbench int             // rlbench commands: 1.5B and 3B at each dp up to W, 7B at W
		fits    map[string]bool // every spec the script writes: whether it must fit
	}{
		{8, 9, map[string]bool{
			"7b-h200-dp8": true, "bench-qwen2.5-1.5b-dp8": true, "bench-qwen2.5-3b-dp8": true,
			"cp-dp8-cp1": false, "cp-dp4-cp2": true, "cp-dp2-cp4": true, "cp-dp8-cp1-recompute": true,
			"long-cp1": false, "long-cp2": true,
		}},
		{2, 5, map[string]bool{
			"7b-h200-dp2": true, "bench-qwen2.5-1.5b-dp2": true, "bench-qwen2.5-3b-dp2": true,
			"cp-dp2-cp1": false, "cp-dp1-cp2": true, "cp-dp2-cp1-recompute": true,
			"long-cp1": false, "long-cp2": true,
		}},
		{4, 7, map[string]bool{
			"7b-h200-dp4": true, "bench-qwen2.5-1.5b-dp4": true, "bench-qwen2.5-3b-dp4": true,
			"cp-dp4-cp1": false, "cp-dp2-cp2": true, "cp-dp1-cp4": true, "cp-dp4-cp1-recompute": true,
			"long-cp1": false, "long-cp2": true,
		}},
	}
	for _, tc := range tests {
		t.Run("W="+strconv.Itoa(tc.world), func(t *testing.T) {
			work := t.TempDir()
			cmd := exec.Command(bash, "scale_device.sh")
			cmd.Env = append(os.Environ(), "SCALE_DRY=1", "SCALE_PHASE=dp 7b cp proc long", "SCALE_GPUS="+strconv.Itoa(tc.world),
				"SCALE_WORK="+work, "OUT="+filepath.Join(work, "out"), "RLBENCH_CACHE="+filepath.Join(work, "rbc"))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("SCALE_DRY=1 bash bench/scale_device.sh: %v\n%s", err, out)
			}
			files, _ := filepath.Glob(filepath.Join(work, "specs", "*.yaml"))
			var names []string
			for _, f := range files {
				names = append(names, strings.TrimSuffix(filepath.Base(f), ".yaml"))
			}
			want := make([]string, 0, len(tc.fits))
			for n := range tc.fits {
				want = append(want, n)
			}
			slices.Sort(names)
			slices.Sort(want)
			if !slices.Equal(names, want) {
				t.Fatalf("the script wrote specs %v, want %v", names, want)
			}
			plans := map[string]*plan.Plan{}
			for _, n := range names {
				s, err := spec.Load(filepath.Join(work, "specs", n+".yaml"))
				if err != nil {
					t.Fatal(err)
				}
				if s.Mesh.GPU != "h200-141g" {
					t.Errorf("%s: mesh.gpu %q, want h200-141g (the device's plan must not depend on NVML)", n, s.Mesh.GPU)
				}
				if s.Mesh.WorldSize() != tc.world {
					t.Errorf("%s: %d ranks, want %d", n, s.Mesh.WorldSize(), tc.world)
				}
				p, fits := planSpec(t, s)
				plans[n] = p
				if fits != tc.fits[n] {
					t.Errorf("%s: fits %v on h200-141g, want %v (device total %.2f GiB)", n, fits, tc.fits[n], gib(p.DeviceTotal()))
				}
				t.Logf("%s: dp %d × cp %d, peak %.2f GiB, arena %.2f GiB, device total %.2f GiB, fits %v", n, s.Mesh.DP, s.Mesh.CPSize(),
					gib(p.PeakBytes), gib(p.DeviceArena), gib(p.DeviceTotal()), fits)
				if !strings.Contains(string(out), n+" (") && tc.fits[n] {
					t.Errorf("the dry run prints no run of %s", n)
				}
			}
			bench := map[string]*Result{}
			for _, line := range strings.Split(string(out), "\n") {
				name, args, ok := strings.Cut(line, ": ")
				if !ok || !strings.Contains(args, "/rlbench ") {
					continue
				}
				name, _, _ = strings.Cut(name, " ")
				o := rlbenchOptions(t, strings.Fields(args)[1:])
				r, err := Run(context.Background(), o)
				if err != nil {
					t.Errorf("%s: rlbench --plan-only: %v", name, err)
					continue
				}
				bench[name] = r
			}
			if len(bench) != tc.rlbench {
				t.Fatalf("the dry run prints %d rlbench commands that plan, want %d:\n%s", len(bench), tc.rlbench, out)
			}
			for name, r := range bench {
				one := bench[regexp.MustCompile(`-dp\d+$`).ReplaceAllString(name, "-dp1")]
				if r.Workload.DP > 1 && one != nil && r.Memory.PlanReserveBytes-one.Memory.PlanReserveBytes != stages.NCCLReserve {
					t.Errorf("%s: reserves %d, dp 1's %d: not the NCCL reserve apart", name, r.Memory.PlanReserveBytes, one.Memory.PlanReserveBytes)
				}
			}
			for _, m := range []string{"qwen2.5-1.5b", "qwen2.5-3b"} {
				n := "bench-" + m + "-dp" + strconv.Itoa(tc.world)
				r, p := bench["rlpipe-"+m+"-dp"+strconv.Itoa(tc.world)], plans[n]
				if r == nil || p == nil {
					t.Errorf("%s: no rlbench run or spec to compare", n)
					continue
				}
				got := [3]int64{p.PeakBytes, p.DeviceArena, p.ReserveBytes()}
				want := [3]int64{r.Memory.PlanPeakBytes, r.Memory.PlanDeviceArenaBytes, r.Memory.PlanReserveBytes}
				if got != want {
					t.Errorf("%s plans peak, arena, reserves %v; rlbench's job at that dp %v", n, got, want)
				}
			}
		})
	}
	for _, ex := range []string{"qwen2.5-7b-grpo-8xh100.yaml", "llama-3.1-8b-offload-8gpu.yaml"} {
		for _, world := range []int{8, 4} {
			t.Run(ex+" W="+strconv.Itoa(world), func(t *testing.T) {
				path := filepath.Join("..", "examples", ex)
				src, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				w := strconv.Itoa(world)
				text := regexp.MustCompile(`(?m)^  (gpus_per_node|dp): 8$`).ReplaceAllString(string(src), "  ${1}: "+w)
				s, err := spec.Parse(path, []byte(text))
				if err != nil {
					t.Fatal(err)
				}
				s.Mesh.GPU = "h200-141g"
				if s.Mesh.WorldSize() != world {
					t.Fatalf("%d ranks, want %d", s.Mesh.WorldSize(), world)
				}
				if p, fits := planSpec(t, s); !fits {
					t.Errorf("does not fit h200-141g at dp %d: device total %.2f GiB, host per node %.2f GiB", world, gib(p.DeviceTotal()), gib(p.HostPerNode(world)))
				}
			})
		}
	}
}

// readScaleScript returns bench/scale_device.sh's text.
func readScaleScript(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("scale_device.sh")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// planSpec plans s as `rlpipe plan` does, on the GPU its mesh.gpu names,
// and says whether it fits that GPU and, where mesh.host_memory is given,
// the node's RAM.
func planSpec(t *testing.T, s *spec.Spec) (*plan.Plan, bool) {
	t.Helper()
	dev, err := resolveGPU(s.Mesh.GPU, 0, "cpu") // rlbench's --gpu: the preset
	var p *plan.Plan
	if err == nil {
		var j *stages.Job
		if j, err = stages.Resolve(s, dev, stages.CheckPlan); err == nil {
			p, err = stages.Plan(j)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if float64(p.DeviceArena) > 1.02*float64(p.PeakBytes) {
		t.Errorf("arena %d is more than 2%% above the peak %d", p.DeviceArena, p.PeakBytes)
	}
	ram := s.Mesh.HostMemory
	return p, p.Fits(dev.Bytes) && (ram == 0 || p.FitsHost(s.Mesh.GPUsPerNode, ram))
}

// rlbenchOptions reads the flags of an rlbench command line that
// scale_device.sh prints (those it passes; any other fails the test) into
// Options, as rlbench's main would, for a plan-only run in a temporary
// directory.
func rlbenchOptions(t *testing.T, args []string) Options {
	t.Helper()
	o := DefaultOptions()
	bools := map[string]*bool{"recompute": &o.Recompute, "offload-ref": &o.OffloadRef}
	strs := map[string]*string{"config": &o.Config, "gpu": &o.GPU, "precision": &o.Precision}
	ints := map[string]*int{"dp": &o.DP, "seqs": &o.Seqs, "tokens-per-seq": &o.TokensPerSeq, "prompt-tokens": &o.PromptTokens,
		"chunk": &o.Chunk, "warmup": &o.Warmup, "steps": &o.Steps}
	ignored := map[string]bool{"backend": true, "cache": true, "out": true, "workdir": true} // the run's, not the plan's
	for i := 0; i < len(args); i++ {
		name := strings.TrimPrefix(args[i], "--")
		if b := bools[name]; b != nil {
			*b = true
			continue
		}
		if i+1 == len(args) {
			t.Fatalf("rlbench %s: %s has no value", strings.Join(args, " "), args[i])
		}
		i++
		var err error
		switch v := args[i]; {
		case strs[name] != nil:
			*strs[name] = v
		case ints[name] != nil:
			*ints[name], err = strconv.Atoi(v)
		case name == "kl-coef":
			o.KLCoef, err = strconv.ParseFloat(v, 64)
		case !ignored[name]:
			err = errors.New("a flag the test does not know")
		}
		if err != nil {
			t.Fatalf("rlbench %s: %s: %v", strings.Join(args, " "), args[i-1], err)
		}
	}
	if o.GPU != "h200-141g" {
		t.Errorf("rlbench --gpu %q, want h200-141g (its plan must not depend on NVML)", o.GPU)
	}
	o.Config = filepath.Join("..", o.Config)
	o.Backend, o.PlanOnly, o.WorkDir = "cpu", true, t.TempDir()
	return o
}

// TestScaleCPRuns checks that SCALE_CP_RUNS picks the cp phase's runs: the
// dry run prints those and no other.
func TestScaleCPRuns(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash to run bench/scale_device.sh")
	}
	all := []string{"gpu-tests-stages (", "gpu-tests-nccl (", "cp-dp2-cp2 (", "cp-dp1-cp4 (", "cp-dp4-cp1-recompute (", "cp-dp2-cp2-procs ("}
	for _, tc := range []struct {
		runs string
		want []string
	}{
		{"", all},
		{"procs", []string{"cp-dp2-cp2-procs ("}},
		{"tests cp4", []string{"gpu-tests-stages (", "gpu-tests-nccl (", "cp-dp1-cp4 ("}},
		{"cp2 recompute", []string{"cp-dp2-cp2 (", "cp-dp4-cp1-recompute ("}},
	} {
		t.Run(tc.runs, func(t *testing.T) {
			work := t.TempDir()
			cmd := exec.Command(bash, "scale_device.sh")
			cmd.Env = append(os.Environ(), "SCALE_DRY=1", "SCALE_PHASE=cp", "SCALE_GPUS=4", "SCALE_WORK="+work,
				"OUT="+filepath.Join(work, "out"), "RLBENCH_CACHE="+filepath.Join(work, "rbc"))
			if tc.runs != "" {
				cmd.Env = append(cmd.Env, "SCALE_CP_RUNS="+tc.runs)
			}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, r := range all {
				if got, want := strings.Contains(string(out), "\n"+r), slices.Contains(tc.want, r); got != want {
					t.Errorf("run %q printed: %v, want %v\n%s", strings.TrimSuffix(r, " ("), got, want, out)
				}
			}
		})
	}
}
