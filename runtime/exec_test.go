package runtime

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/rlpipe/rlpipe/spec"
)

var errBoom = errors.New("boom")

// statuses returns "id:status" for every stage of a report, in order.
func statuses(r *Report) []string {
	var out []string
	for _, s := range r.Stages {
		out = append(out, s.ID+":"+string(s.Status))
	}
	return out
}

func TestExecute(t *testing.T) {
	pipeline := []def{
		setup("load", "load_hf"),
		step("pack", "pack", "load"),
		step("lp", "actor_logprob", "pack"),
		step("train", "train", "lp"),
		step("update_ref", "update_ref", "train").onlyWhen("step % 10 == 0"),
		step("log", "log", "update_ref"),
		step("side", "eval"),
	}
	tests := []struct {
		name       string
		phase      spec.Phase
		step       int
		fail       string // id of the stage whose run fails
		panics     string // id of the stage whose run panics
		wantRan    []string
		wantStatus []string
		wantErr    string
		wantReason map[string]string
	}{
		{
			name:       "setup",
			phase:      spec.Setup,
			wantRan:    []string{"load"},
			wantStatus: []string{"load:ran"},
		},
		{
			name:       "all run",
			phase:      spec.Step,
			step:       10,
			wantRan:    []string{"pack", "lp", "train", "update_ref", "log", "side"},
			wantStatus: []string{"pack:ran", "lp:ran", "train:ran", "update_ref:ran", "log:ran", "side:ran"},
		},
		{
			name:       "when false skips only that stage",
			phase:      spec.Step,
			step:       11,
			wantRan:    []string{"pack", "lp", "train", "log", "side"},
			wantStatus: []string{"pack:ran", "lp:ran", "train:ran", "update_ref:skipped", "log:ran", "side:ran"},
			wantReason: map[string]string{"update_ref": "when false: step % 10 == 0"},
		},
		{
			name:       "root cause",
			phase:      spec.Step,
			step:       10,
			fail:       "lp",
			wantRan:    []string{"pack", "lp"},
			wantStatus: []string{"pack:ran", "lp:failed", "train:not run", "update_ref:not run", "log:not run", "side:not run"},
			wantErr:    `stage "lp" (actor_logprob) at job.yaml:20:7: boom`,
			wantReason: map[string]string{
				"train":      "upstream lp failed",
				"update_ref": "upstream lp failed",
				"log":        "upstream lp failed",
				"side":       "stopped after lp failed",
			},
		},
		{
			name:       "last stage fails",
			phase:      spec.Step,
			step:       1,
			fail:       "side",
			wantRan:    []string{"pack", "lp", "train", "log", "side"},
			wantStatus: []string{"pack:ran", "lp:ran", "train:ran", "update_ref:skipped", "log:ran", "side:failed"},
			wantErr:    `stage "side" (eval) at job.yaml:40:7: boom`,
		},
		{
			name:       "panic becomes an error",
			phase:      spec.Step,
			step:       1,
			panics:     "train",
			wantRan:    []string{"pack", "lp", "train"},
			wantStatus: []string{"pack:ran", "lp:ran", "train:failed", "update_ref:not run", "log:not run", "side:not run"},
			wantErr:    `stage "train" (train) at job.yaml:25:7: panic: kaput`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewGraph(build(t, pipeline...))
			if err != nil {
				t.Fatal(err)
			}
			var ran []string
			run := func(ctx context.Context, n *Node) error {
				ran = append(ran, n.Stage.ID)
				switch n.Stage.ID {
				case tt.fail:
					return errBoom
				case tt.panics:
					panic("kaput")
				}
				return nil
			}
			env := func(*Node) *spec.Env { return &spec.Env{Step: tt.step} }
			rep, err := Execute(context.Background(), g, tt.phase, env, run)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("Execute: %v", err)
			}
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Execute error = %v, want %q", err, tt.wantErr)
				}
				if tt.fail != "" && !errors.Is(err, errBoom) {
					t.Errorf("error does not wrap the cause")
				}
				var pe *PanicError
				if tt.panics != "" && (!errors.As(err, &pe) || len(pe.Stack) == 0) {
					t.Errorf("error does not wrap a *PanicError with a stack")
				}
				if id := tt.fail + tt.panics; rep.Failed != id {
					t.Errorf("Report.Failed = %q, want %q", rep.Failed, id)
				}
			}
			if !reflect.DeepEqual(ran, tt.wantRan) {
				t.Errorf("ran %v, want %v", ran, tt.wantRan)
			}
			if got := statuses(rep); !reflect.DeepEqual(got, tt.wantStatus) {
				t.Errorf("statuses %v, want %v", got, tt.wantStatus)
			}
			for id, want := range tt.wantReason {
				if r := rep.Result(id); r == nil || r.Reason != want {
					t.Errorf("%s: reason %+v, want %q", id, r, want)
				}
			}
			if rep.Phase != tt.phase {
				t.Errorf("Report.Phase = %q, want %q", rep.Phase, tt.phase)
			}
			if !strings.HasPrefix(rep.String(), string(tt.phase)+":\n") {
				t.Errorf("Report.String() = %q", rep.String())
			}
		})
	}
}

func TestExecuteWhenError(t *testing.T) {
	g, err := NewGraph(build(t, step("a", "k"), step("b", "k", "a").onlyWhen("int(stage.id) > 0"), step("c", "k", "b")))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Execute(context.Background(), g, spec.Step, nil, func(context.Context, *Node) error { return nil })
	want := `stage "b" (k) at job.yaml:15:7: when: job.yaml:18:13: evaluating "int(stage.id) > 0"`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("Execute error = %v, want prefix %q", err, want)
	}
	if got, want := statuses(rep), []string{"a:ran", "b:failed", "c:not run"}; !reflect.DeepEqual(got, want) {
		t.Errorf("statuses %v, want %v", got, want)
	}
}

func TestExecuteCanceled(t *testing.T) {
	errStop := errors.New("operator stop")
	tests := []struct {
		name       string
		cancelAt   string // stage whose run cancels the context; "" cancels before Execute
		cause      error
		wantRan    []string
		wantStatus []string
		wantErr    string
	}{
		{
			name:       "before the first stage",
			wantStatus: []string{"a:not run", "b:not run", "c:not run"},
			wantErr:    `step phase stopped before stage "a": context canceled`,
		},
		{
			name:       "during a stage",
			cancelAt:   "a",
			wantRan:    []string{"a"},
			wantStatus: []string{"a:ran", "b:not run", "c:not run"},
			wantErr:    `step phase stopped before stage "b": context canceled`,
		},
		{
			name:       "with a cause",
			cancelAt:   "b",
			cause:      errStop,
			wantRan:    []string{"a", "b"},
			wantStatus: []string{"a:ran", "b:ran", "c:not run"},
			wantErr:    `step phase stopped before stage "c": context canceled (operator stop)`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := NewGraph(build(t, step("a", "k"), step("b", "k", "a"), step("c", "k", "b")))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			if tt.cancelAt == "" {
				cancel(tt.cause)
			}
			var ran []string
			run := func(ctx context.Context, n *Node) error {
				ran = append(ran, n.Stage.ID)
				if n.Stage.ID == tt.cancelAt {
					cancel(tt.cause)
				}
				return nil
			}
			rep, err := Execute(ctx, g, spec.Step, nil, run)
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("Execute error = %v, want %q", err, tt.wantErr)
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("error does not wrap context.Canceled")
			}
			if tt.cause != nil && !errors.Is(err, tt.cause) {
				t.Errorf("error does not wrap the cause")
			}
			if !reflect.DeepEqual(ran, tt.wantRan) {
				t.Errorf("ran %v, want %v", ran, tt.wantRan)
			}
			if got := statuses(rep); !reflect.DeepEqual(got, tt.wantStatus) {
				t.Errorf("statuses %v, want %v", got, tt.wantStatus)
			}
		})
	}
}

func TestExecuteStageSeesContext(t *testing.T) {
	g, err := NewGraph(build(t, step("a", "k")))
	if err != nil {
		t.Fatal(err)
	}
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "v")
	_, err = Execute(ctx, g, spec.Step, nil, func(ctx context.Context, n *Node) error {
		if ctx.Value(key{}) != "v" {
			return errors.New("run did not get the caller's context")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestExecuteBadArguments(t *testing.T) {
	g, err := NewGraph(build(t, step("a", "k")))
	if err != nil {
		t.Fatal(err)
	}
	nop := func(context.Context, *Node) error { return nil }
	tests := []struct {
		name  string
		g     *Graph
		phase spec.Phase
		run   func(context.Context, *Node) error
		want  string
	}{
		{"no graph", nil, spec.Step, nop, "execute: no graph"},
		{"no run", g, spec.Step, nil, "execute: no run function"},
		{"bad phase", g, "warmup", nop, `execute: unknown phase "warmup"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := Execute(context.Background(), tt.g, tt.phase, nil, tt.run)
			if err == nil || err.Error() != tt.want {
				t.Errorf("Execute error = %v, want %q", err, tt.want)
			}
			if rep == nil {
				t.Errorf("Execute returned no report")
			}
		})
	}
}
