package plan

import (
	"testing"
)

// checkNoOverlap fails when two buffers that are live at the same op share bytes.
func checkNoOverlap(t *testing.T, p *Plan) {
	t.Helper()
	for i, a := range p.Buffers {
		for _, b := range p.Buffers[i+1:] {
			if a.Host != b.Host || a.Resident != b.Resident || a.Bytes == 0 || b.Bytes == 0 {
				continue
			}
			liveTogether := a.Start <= b.End && b.Start <= a.End
			memOverlap := a.Offset < b.Offset+b.Bytes && b.Offset < a.Offset+a.Bytes
			if liveTogether && memOverlap {
				t.Errorf("%s [%d,%d]@%d+%d overlaps %s [%d,%d]@%d+%d", a.Name, a.Start, a.End, a.Offset, a.Bytes, b.Name, b.Start, b.End, b.Offset, b.Bytes)
			}
		}
	}
}

func TestAssign(t *testing.T) {
	type buf struct {
		name       string
		bytes      int64
		start, end int
	}
	tests := []struct {
		name      string
		ops       int
		bufs      []buf
		wantArena int64
		wantPeak  int64
		offsets   map[string]int64
	}{
		{
			name: "disjoint lifetimes share one slot",
			ops:  3,
			bufs: []buf{{"a", 1024, 0, 0}, {"b", 1024, 1, 1}, {"c", 1024, 2, 2}},
			// every buffer fits at offset 0
			wantArena: 1024, wantPeak: 1024,
			offsets: map[string]int64{"a": 0, "b": 0, "c": 0},
		},
		{
			name:      "overlapping lifetimes stack",
			ops:       2,
			bufs:      []buf{{"a", 512, 0, 1}, {"b", 256, 0, 1}},
			wantArena: 768, wantPeak: 768,
			offsets: map[string]int64{"a": 0, "b": 512},
		},
		{
			name: "small buffer reuses a freed gap (best fit)",
			ops:  3,
			// big lives throughout; mid dies at op 0; small is born at op 1
			// and lands in mid's old place, not above big.
			bufs:      []buf{{"big", 2048, 0, 2}, {"mid", 512, 0, 0}, {"small", 256, 1, 2}},
			wantArena: 2560, wantPeak: 2560,
			offsets: map[string]int64{"big": 0, "mid": 2048, "small": 2048},
		},
		{
			name: "long-lived first (largest area) beats largest first",
			ops:  6,
			// Largest first places c, then d above it (they meet at op 2),
			// a below d, and b, which meets a and d, above both: 1792.
			// Placing d, whose bytes times lifetime are the largest,
			// first leaves a, b and c room around it: the peak, 1536.
			bufs:      []buf{{"a", 512, 3, 4}, {"b", 512, 4, 5}, {"c", 768, 2, 2}, {"d", 512, 1, 5}},
			wantArena: 1536, wantPeak: 1536,
			offsets: map[string]int64{"d": 0, "a": 512, "b": 1024, "c": 512},
		},
		{
			name:      "sizes are aligned up to 256",
			ops:       1,
			bufs:      []buf{{"a", 1, 0, 0}, {"b", 257, 0, 0}},
			wantArena: 256 + 512, wantPeak: 768,
			offsets: map[string]int64{"b": 0, "a": 512},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBuilder()
			b.BeginStage("s", "k", "step")
			for i := 0; i < tt.ops; i++ {
				b.Op("op")
			}
			for _, x := range tt.bufs {
				b.Alloc(x.name, Activations, x.bytes, x.start, x.end)
			}
			p, err := b.Finish()
			if err != nil {
				t.Fatal(err)
			}
			if p.DeviceArena != tt.wantArena {
				t.Errorf("arena = %d, want %d", p.DeviceArena, tt.wantArena)
			}
			if p.PeakBytes != tt.wantPeak {
				t.Errorf("peak = %d, want %d", p.PeakBytes, tt.wantPeak)
			}
			if got := livePeak(p.Buffers); got != tt.wantPeak {
				t.Errorf("livePeak = %d, want %d", got, tt.wantPeak)
			}
			for n, off := range tt.offsets {
				if got := p.Buffer(n).Offset; got != off {
					t.Errorf("%s offset = %d, want %d", n, got, off)
				}
			}
			checkNoOverlap(t, p)
		})
	}
}

func TestFinishErrors(t *testing.T) {
	tests := []struct {
		name  string
		build func(b *Builder)
	}{
		{"duplicate name", func(b *Builder) { b.Op("x"); b.Alloc("a", IO, 1, 0, 0); b.Alloc("a", IO, 1, 0, 0) }},
		{"end before start", func(b *Builder) { b.Op("x"); b.Op("y"); b.Alloc("a", IO, 1, 1, 0) }},
		{"past the timeline", func(b *Builder) { b.Op("x"); b.Alloc("a", IO, 1, 0, 5) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBuilder()
			tt.build(b)
			if _, err := b.Finish(); err == nil {
				t.Fatal("Finish succeeded, want an error")
			}
		})
	}
}

func TestPersistentAndBudget(t *testing.T) {
	b := NewBuilder()
	b.BeginStage("setup", "apply_fsdp2", "setup")
	op := b.Op("shard")
	b.Persistent("params", Params, 4096, false, op)
	b.Persistent("host", Params, 8192, true, op)
	b.BeginStage("fwd", "ref_logprob", "step")
	o1 := b.Op("a")
	o2 := b.Op("b")
	b.Alloc("x", Activations, 1024, o1, o2)
	b.Alloc("y", Logits, 2048, o2, o2)
	b.EndStage()
	p, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Buffer("params").End; got != o2 {
		t.Errorf("persistent buffer ends at %d, want the last op %d", got, o2)
	}
	if p.PeakBytes != 4096+1024+2048 || p.PeakStage != "fwd" {
		t.Errorf("peak = %d in %q, want %d in fwd", p.PeakBytes, p.PeakStage, 4096+1024+2048)
	}
	fwd := p.Budget[1]
	if fwd.PeakOp != "b" || fwd.ByKind[Params] != 4096 || fwd.ByKind[Activations] != 1024 || fwd.ByKind[Logits] != 2048 {
		t.Errorf("fwd budget = %+v", fwd)
	}
	if fwd.HostBytes != 8192 || p.HostArena != 8192 {
		t.Errorf("host bytes = %d / arena %d, want 8192", fwd.HostBytes, p.HostArena)
	}
	if !p.Fits(p.DeviceTotal()) || p.Fits(p.DeviceTotal()-1) {
		t.Error("Fits disagrees with DeviceTotal")
	}
	checkNoOverlap(t, p)
}

func TestHostPerNode(t *testing.T) {
	p := &Plan{HostArena: 10, HostBuffers: []HostUse{{Name: "load", Bytes: 3}, {Name: "checkpoint", Bytes: 4}, {Name: "export", Bytes: 7, Rank0: true}}}
	tests := []struct {
		ranks int
		want  int64
	}{
		{1, 17},        // rank 0 alone: pinned + export
		{8, 7*14 + 17}, // seven ranks with their checkpoint buffer, rank 0 with the export
		{0, 17},        // unknown: one rank
	}
	for _, tc := range tests {
		if got := p.HostPerNode(tc.ranks); got != tc.want {
			t.Errorf("HostPerNode(%d) = %d, want %d", tc.ranks, got, tc.want)
		}
	}
	if !p.FitsHost(8, 115) || p.FitsHost(8, 114) {
		t.Error("FitsHost disagrees with HostPerNode")
	}
	p.HostProcess = 5
	if got := p.HostPerNode(8); got != 7*14+17+8*5 {
		t.Errorf("HostPerNode(8) with a process estimate of 5 = %d, want %d", got, 7*14+17+8*5)
	}
}
