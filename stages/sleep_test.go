package stages

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/gpu"
	"github.com/rlpipe/rlpipe/gpu/cpu"
	"github.com/rlpipe/rlpipe/gpu/lazy"
	"github.com/rlpipe/rlpipe/runtime/plan"
	"github.com/rlpipe/rlpipe/spec"
	"github.com/rlpipe/rlpipe/stages/engines/enginetest"
)

const (
	rewardLine = "        reward: {expr: 'count(response, # < 64) / len(response)'}\n"
	packLine   = "    - {id: pack, uses: pack}\n"
)

// colocated is the live recipe on an SGLang test engine at url, colocated:
// the trainer wakes after generate (the engine releases its memory),
// pushes the actor to dir after training, and sleeps at the end of the
// step (the engine resumes and loads the push). Without sleepWake, the
// same recipe with neither stage (the push has no engine).
func colocated(t *testing.T, url, dir string, steps int, sleepWake bool) *spec.Spec {
	t.Helper()
	wake, sleep := "", ""
	if sleepWake {
		wake = "    - {id: wake, uses: wake, with: {engine: sglang, url: '" + url + "'}}\n"
		sleep = "    - {id: sleep, uses: sleep, with: {engine: sglang, url: '" + url + "', reload: push}}\n"
	}
	return liveOn(t, EngineSGLang, url, steps,
		packLine, wake+packLine,
		syncRef, syncRef+"    - {id: push, uses: push_weights, with: {dir: "+filepath.Join(dir, "policy")+", dtype: fp32}}\n"+sleep)
}

type colocatedRun struct {
	j      *Job
	p      *plan.Plan
	res    *Result
	steps  []StepResult
	losses []float64
}

func runColocated(t *testing.T, s *spec.Spec, dp int) *colocatedRun {
	t.Helper()
	return runColocatedWith(t, s, dp, RunOptions{})
}

// runColocatedWith is runColocated with opts' backends and communicators.
func runColocatedWith(t *testing.T, s *spec.Spec, dp int, opts RunOptions) *colocatedRun {
	t.Helper()
	s.Mesh.GPUsPerNode, s.Mesh.DP = dp, dp
	out := &colocatedRun{j: resolveSpec(t, s)}
	var err error
	if out.p, err = Plan(out.j); err != nil {
		t.Fatal(err)
	}
	opts.Export = "actor"
	opts.AfterStep = func(r *Rank, sr StepResult) error {
		if r.ID == 0 {
			out.steps = append(out.steps, sr)
			out.losses = append(out.losses, sr.Stats.Values["loss"])
		}
		return nil
	}
	out.res, err = Run(context.Background(), out.j, out.p, opts)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSleepWake runs the colocated live loop for 3 steps on 1 and 2 ranks:
// the trainer sleeps at the end of every step and wakes after the next
// generate, and trains exactly (bit for bit) as the same recipe without
// sleeping; the engine is asked to release its memory before every wake,
// to resume it after every sleep and then to load the step's push; the
// device arena is released while asleep, and the export at the end reads
// the sleeping trainer's state from host memory.
func TestSleepWake(t *testing.T) {
	for _, dp := range []int{1, 2} {
		t.Run(map[int]string{1: "1 rank", 2: "2 ranks"}[dp], func(t *testing.T) {
			srv := enginetest.NewSGLang(fakePolicy)
			defer srv.Close()
			awake := runColocated(t, colocated(t, srv.URL, t.TempDir(), 3, false), dp)
			srv2 := enginetest.NewSGLang(fakePolicy)
			defer srv2.Close()
			dir := t.TempDir()
			r := runColocated(t, colocated(t, srv2.URL, dir, 3, true), dp)
			if !reflect.DeepEqual(r.losses, awake.losses) {
				t.Errorf("losses %v with sleep and wake, %v without", r.losses, awake.losses)
			}
			if !reflect.DeepEqual(r.res.Export, awake.res.Export) {
				t.Error("the trained weights differ from those of the same recipe without sleep and wake")
			}
			var control []string
			for _, path := range srv2.Paths() {
				if path != "/generate" {
					control = append(control, path)
				} else if n := len(control); n > 0 && control[n-1] != "/update_weights_from_disk" {
					t.Fatalf("a generate request after %s, before the engine loaded the push", control[n-1])
				}
			}
			cycle := []string{"/release_memory_occupation", "/resume_memory_occupation", "/update_weights_from_disk"}
			if want := append(append(append([]string(nil), cycle...), cycle...), cycle...); !reflect.DeepEqual(control, want) {
				t.Errorf("engine control calls %v, want %v", control, want)
			}
			if got, want := srv2.ModelPath(), filepath.Join(dir, "policy.step-3"); got != want {
				t.Errorf("the engine last loaded %q, want %q", got, want)
			}
			// With side and Down streams that run only when waited for
			// (gpu/lazy), their work still queued when the trainer sleeps
			// would fail on the released arena, and work that did not wait
			// for them would change the run.
			srv3 := enginetest.NewSGLang(fakePolicy)
			defer srv3.Close()
			lz := runColocatedWith(t, colocated(t, srv3.URL, t.TempDir(), 3, true), dp, RunOptions{
				Backend: func(int) (gpu.Backend, error) { return lazy.New(cpu.New()), nil },
				Comms:   streamComms,
			})
			if !reflect.DeepEqual(lz.losses, awake.losses) || !reflect.DeepEqual(lz.res.Export, awake.res.Export) {
				t.Errorf("losses %v with sleep and wake and lazy streams, %v awake; or the weights differ", lz.losses, awake.losses)
			}
			for _, sr := range r.steps {
				v := sr.Stats.Values
				if v["sleep_gb"] <= 0 || v["asleep_plan_bytes"] != float64(r.p.AsleepDeviceBytes()) {
					t.Errorf("step %d: sleep_gb %v, asleep_plan_bytes %v (plan %d)", sr.Step, v["sleep_gb"], v["asleep_plan_bytes"], r.p.AsleepDeviceBytes())
				}
				// The first wake finds the trainer awake.
				if _, woke := v["wake_gb"]; woke != (sr.Step > 1) {
					t.Errorf("step %d: wake_gb %v reported: %v", sr.Step, v["wake_gb"], woke)
				}
			}
			for _, rk := range r.res.Ranks {
				if !rk.Arena.Asleep() || !rk.Arena.dev.(*cpu.Memory).Released() {
					t.Errorf("rank %d: after the run, asleep %v, device arena released %v", rk.ID, rk.Arena.Asleep(), rk.Arena.dev.(*cpu.Memory).Released())
				}
			}
		})
	}
}

// TestSleepPlanColocated: the colocated recipe's plan saves the persistent device
// state at the sleep, keeps only generate's buffers (resident) and the
// kept reserves on the device while asleep, and says so.
func TestSleepPlanColocated(t *testing.T) {
	j := resolveSpec(t, colocated(t, "http://127.0.0.1:1", t.TempDir(), 2, true))
	p, err := Plan(j)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Sleeps) != 1 || p.Sleeps[0].Stage != "sleep" {
		t.Fatalf("sleeps %+v", p.Sleeps)
	}
	var saved int64
	for _, b := range p.Buffers {
		switch {
		case b.Resident && b.Stage != "generate":
			t.Errorf("buffer %s of stage %s is resident", b.Name, b.Stage)
		case !b.Host && !b.Resident && b.End == len(p.Ops)-1 && b.Start < p.Stages[3].First:
			saved += b.Bytes // a setup stage's persistent device buffer
		}
	}
	if p.Sleeps[0].Bytes != saved || saved == 0 {
		t.Errorf("the sleep saves %d bytes, the persistent device buffers are %d", p.Sleeps[0].Bytes, saved)
	}
	if p.ResidentArena == 0 || p.AsleepDeviceBytes() != p.ResidentArena+CUDAContextReserve {
		t.Errorf("resident %d, asleep device %d", p.ResidentArena, p.AsleepDeviceBytes())
	}
	asleep := j.asleepAfter()
	for _, st := range p.Stages {
		want := ""
		if st.ID == "generate" || st.ID == "wake" {
			want = "sleep"
		}
		if asleep[st.ID] != want {
			t.Errorf("stage %s: asleep after %q, want %q", st.ID, asleep[st.ID], want)
		}
	}
}

func TestValidateSleep(t *testing.T) {
	const f = "../examples/tiny-live.yaml"
	url := "http://127.0.0.1:1"
	wake := "    - {id: wake, uses: wake, with: {engine: sglang, url: '" + url + "'}}\n"
	sleep := "    - {id: sleep, uses: sleep, with: {engine: sglang, url: '" + url + "'}}\n"
	const why = " but the trainer may be asleep when it runs (stage \"sleep\" released the device, and no wake stage without `when` comes between): run it after a wake"
	tests := []struct {
		name string
		s    *spec.Spec
		want []string
	}{
		{"no wake", liveOn(t, EngineSGLang, url, 2, syncRef, syncRef+sleep), []string{
			f + `:56:24: stage "pack" uses batch,` + why,
			f + `:57:28: stage "ref_logp" uses batch,`,
			f + `:58:28: stage "old_logp" uses batch,`,
			f + `:60:13: stage "train" uses batch,`,
			f + `:62:28: stage "sync_ref" uses weights/actor,`,
		}},
		{"conditional wake", liveOn(t, EngineSGLang, url, 2, packLine, strings.Replace(wake, "}}", "}, when: step > 1}", 1)+packLine, syncRef, syncRef+sleep), []string{
			f + `:57:24: stage "pack" uses batch,`, f + `:58:28: stage "ref_logp"`, f + `:59:28: stage "old_logp"`, f + `:61:13: stage "train"`, f + `:63:28: stage "sync_ref"`,
		}},
		{"local engine asleep", variant(t, livePath, packLine, wake+packLine, syncRef, syncRef+sleep), []string{
			f + `:48:13: stage "generate" uses weights/actor,` + why,
		}},
		{"reload without engine", liveOn(t, EngineSGLang, url, 2, packLine, wake+packLine, syncRef, syncRef+"    - {id: push, uses: push_weights, with: {dir: policy}}\n    - {id: sleep, uses: sleep, with: {reload: push}}\n"), []string{
			f + `:65:47: stage "sleep": reload has the engine load pushed weights, but engine is not set (sglang or openai)`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := resolveErrors(t, tt.s)
			if len(got) != len(tt.want) {
				t.Fatalf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tt.want[i]) {
					t.Errorf("error %d:\n%s\nwant:\n%s", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// TestArenaSleep puts an arena to sleep on the CPU backend: the saved
// buffers come back bit for bit, a device buffer cannot be used while
// asleep, resident and host buffers can, and Readable finds the saved
// bytes.
func TestArenaSleep(t *testing.T) {
	b := plan.NewBuilder()
	b.BeginStage("setup", "s", "setup")
	b.Op("init")
	b.Persistent("params", plan.Params, 1024, false, b.Now())
	b.BeginStage("gen", "g", "step")
	b.Op("gen")
	b.Resident("share", plan.IO, 256, b.Now(), b.Now())
	b.BeginStage("wake", "wake", "step")
	b.Op("wake")
	b.BeginStage("use", "u", "step")
	b.Op("use")
	b.Alloc("tmp", plan.Activations, 256, b.Now(), b.Now())
	b.BeginStage("sleep", "sleep", "step")
	b.Op("sleep")
	b.MarkSleep()
	p, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New()
	a, err := NewArena(be, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.EnterNamed("init"); err != nil {
		t.Fatal(err)
	}
	params, err := a.Tensor("params", gpu.F32, 256)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]float32, 256)
	for i := range want {
		want[i] = float32(i)*0.37 - 11
	}
	if err := be.Upload(params, want); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"gen", "wake", "use", "sleep"} {
		if err := a.EnterNamed(op); err != nil {
			t.Fatal(err)
		}
	}
	n, err := a.Sleep(be)
	if err != nil || n != 1024 {
		t.Fatalf("sleep: %d bytes, %v", n, err)
	}
	got := make([]float32, 256)
	if err := be.Download(got, params); err == nil || !strings.Contains(err.Error(), "released") {
		t.Errorf("reading a released view: %v", err)
	}
	h, err := a.Readable(params)
	if err != nil {
		t.Fatal(err)
	}
	if err := be.Download(got, h); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("the host copy: %v, %v", got[:4], err)
	}
	if err := a.StartStage("gen"); err != nil {
		t.Fatal(err)
	}
	if err := a.EnterNamed("gen"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Tensor("share", gpu.F32, 64); err != nil {
		t.Errorf("a resident buffer while asleep: %v", err)
	}
	if err := a.EnterNamed("wake"); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Wake(be); err != nil || n != 1024 {
		t.Fatalf("wake: %d bytes, %v", n, err)
	}
	if err := be.Download(got, params); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("after waking, params %v (%v), want them as they were", got[:4], err)
	}
	if err := a.EnterNamed("use"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Tensor("tmp", gpu.F32, 64); err != nil {
		t.Errorf("a device buffer after waking: %v", err)
	}
	// Asleep again, a device buffer is refused.
	if err := a.EnterNamed("sleep"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Sleep(be); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Tensor("params", gpu.F32, 256); err == nil || !strings.Contains(err.Error(), `released while the trainer sleeps (since stage "sleep")`) {
		t.Errorf("a device buffer while asleep: %v", err)
	}
}
