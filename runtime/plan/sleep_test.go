package plan

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// sleepyPlan builds a setup stage (params and optimizer state, persistent)
// and a step phase of five stages: gen, wake, train, push, sleep.
func sleepyPlan(t *testing.T, genBuf func(b *Builder)) (*Plan, error) {
	t.Helper()
	b := NewBuilder()
	b.AddReserve(Reserve{Name: "context", Bytes: 1000})
	b.AddReserve(Reserve{Name: "workspace", Bytes: 300, Released: true})
	b.BeginStage("shard", "apply_fsdp2", "setup")
	b.Op("shard")
	b.Persistent("params", Params, 4096, false, b.Now())
	b.Persistent("adam", Optimizer, 8192, false, b.Now())
	b.Persistent("offloaded", Optimizer, 1024, true, b.Now())
	b.BeginStage("gen", "generate", "step")
	b.Op("generate")
	genBuf(b)
	b.BeginStage("wake", "wake", "step")
	b.Op("wake")
	b.BeginStage("train", "train", "step")
	b.Op("forward")
	act := b.Alloc("act", Activations, 2048, b.Now(), b.Now())
	b.Op("backward")
	act.End = b.Now()
	b.BeginStage("push", "push_weights", "step")
	b.Op("gather")
	b.Alloc("gathered", Gathered, 4096, b.Now(), b.Now())
	b.BeginStage("sleep", "sleep", "step")
	b.Op("sleep")
	b.MarkSleep()
	return b.Finish()
}

func TestSleepPlan(t *testing.T) {
	p, err := sleepyPlan(t, func(b *Builder) { b.Resident("share", IO, 512, b.Now(), b.Now()) })
	if err != nil {
		t.Fatal(err)
	}
	checkNoOverlap(t, p)
	// Ops: shard 0, generate 1, wake 2, forward 3, backward 4, gather 5, sleep 6.
	if len(p.Sleeps) != 1 || p.Sleeps[0].Op != 6 || p.Sleeps[0].Stage != "sleep" {
		t.Fatalf("sleeps %+v, want one at op 6", p.Sleeps)
	}
	var names []string
	for _, s := range p.Sleeps[0].Saved {
		names = append(names, s.Buffer)
		if s.DeviceOffset != p.Buffer(s.Buffer).Offset {
			t.Errorf("%s: device offset %d, buffer at %d", s.Buffer, s.DeviceOffset, p.Buffer(s.Buffer).Offset)
		}
	}
	// The persistent device buffers only: not the host one, not the
	// resident one, not the transients that ended.
	if !reflect.DeepEqual(names, []string{"adam", "params"}) || p.Sleeps[0].Bytes != 4096+8192 || p.SavedBytes() != 4096+8192 {
		t.Errorf("saved %v (%d bytes), want adam and params", names, p.Sleeps[0].Bytes)
	}
	area := p.Buffer(SleepArea)
	if area == nil || !area.Host || area.Bytes != 4096+8192 {
		t.Fatalf("sleep area %+v", area)
	}
	// The saved copies lie inside the area, one after the other.
	if s := p.Sleeps[0].Saved; s[0].HostOffset != area.Offset || s[1].HostOffset != area.Offset+8192 {
		t.Errorf("host offsets %d and %d, area at %d", s[0].HostOffset, s[1].HostOffset, area.Offset)
	}
	if p.ResidentArena != 512 || p.DeviceTotal() != p.DeviceArena+512+1300 || p.AsleepDeviceBytes() != 512+1000 {
		t.Errorf("resident %d, device total %d (arena %d), asleep %d", p.ResidentArena, p.DeviceTotal(), p.DeviceArena, p.AsleepDeviceBytes())
	}
	var out bytes.Buffer
	if err := p.Render(&out, Header{Job: "j", GPUName: "g", GPUBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"resident            0.00 MiB", "asleep device", "while the trainer sleeps: resident + context; released: arena, workspace", "pinned copy of 2 device buffers at stage sleep"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestSleepPlanPhases(t *testing.T) {
	b := NewBuilder()
	b.BeginStage("setup", "s", "setup")
	b.Op("a")
	b.MarkSleep()
	b.BeginStage("step", "s", "step")
	b.Op("b")
	b.MarkSleep()
	if _, err := b.Finish(); err == nil || !strings.Contains(err.Error(), `sleep marks in phases "setup" and "step"`) {
		t.Errorf("sleeps in two phases: %v", err)
	}
}
