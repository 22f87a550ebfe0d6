package spec

import (
	"fmt"
	"strings"
	"testing"
)

func TestAt(t *testing.T) {
	const file = "testdata/valid/example.yaml"
	s, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path, pos string // pos is line:col
	}{
		{"", "1:1"},
		{"version", "1:10"},
		{"nope", "1:1"},
		{"models", "3:1"},
		{"models.actor", "4:3"},
		{"models.actor.path", "5:11"},
		{"models.ref.copy_of", "7:14"},
		{"models.ref.path", "6:3"},
		{"models.critic.path", "3:1"},
		{"mesh", "8:1"},
		{"mesh.gpu", "12:8"},
		{"data.rollouts", "14:13"},
		{"data.rollout_batch_size", "17:23"},
		{"data.nope", "13:1"},
		{"train.shuffle", "25:12"},
		{"train.seed", "27:9"},
		{"train.betas", "30:3"},
		{"train.betas[1]", "30:16"},
		{"train.betas[2]", "30:3"},
		{"train.decay_steps", "37:16"},
		{"train.nope.deeper", "22:1"},
		{"policies.precision", "42:14"},
		{"stages.setup[1]", "49:7"},
		{"stages.setup[1].needs", "51:7"},
		{"stages.setup[1].needs[0]", "51:15"},
		{"stages.setup[1].with.model", "52:21"},
		{"stages.step[1].with", "59:7"},
		{"stages.step[1].with.eps_clip", "59:24"},
		{"stages.step[1].with.kl", "59:7"},
		{"stages.step[2].needs", "62:14"},
		{"stages.step[2].when", "63:13"},
		{"stages.step[7].id", "53:3"},
	}
	for _, tt := range tests {
		if got := s.At(tt.path); got != atPos(file, tt.pos) {
			t.Errorf("At(%q) = %v, want %s", tt.path, got, tt.pos)
		}
	}
	// The positions the Spec holds are those of At.
	same := map[string]Pos{
		"mesh": s.Mesh.Pos, "data": s.Data.Pos, "train": s.Train.Pos,
		"stages.step[2].uses": s.Step[2].UsesPos, "stages.step[2].when": s.Step[2].When.Pos,
		"stages.step[2].needs": s.Step[2].Needs[0].Pos, "stages.setup[1].needs[0]": s.Setup[1].Needs[0].Pos,
	}
	for _, m := range s.Models {
		same["models."+m.Name] = m.Pos
	}
	for i, st := range s.Setup {
		same[fmt.Sprintf("stages.setup[%d]", i)] = st.Pos
	}
	for i, st := range s.Step {
		same[fmt.Sprintf("stages.step[%d]", i)] = st.Pos
	}
	for path, pos := range same {
		if got := s.At(path); got != pos {
			t.Errorf("At(%q) = %v, the Spec holds %v", path, got, pos)
		}
	}
	if got := (&Spec{File: "x.yaml"}).At("mesh.gpu"); got != (Pos{File: "x.yaml"}) {
		t.Errorf("At of an unparsed spec = %v", got)
	}
}

// atPos returns the position line:col in file.
func atPos(file, lc string) Pos {
	p := Pos{File: file}
	fmt.Sscanf(lc, "%d:%d", &p.Line, &p.Col)
	return p
}

func TestAtSpecial(t *testing.T) {
	tests := []struct {
		name, extra string
		path, pos   string // pos is line:col, counting lines from the first of extra
	}{
		{"absent section", "", "mesh.gpu", "=1:1"},
		{"null section", "mesh:\n", "mesh.gpu", "1:1"},
		{"null value", "stages:\n  setup:\n", "stages.setup[0].id", "2:3"},
		{"alias value", "mesh: {gpu: *p}\n", "mesh.gpu", "1:13"},
		{"anchored value", "mesh: {gpu: *p}\n", "models.actor.path", "=5:11"},
		{"flow mapping", "mesh: {nodes: 2, gpus_per_node: 4}\n", "mesh.gpus_per_node", "1:33"},
		{"dotted model name", "models:\n  qwen2.5: {role: actor, path: m}\n  qwen2: {role: ref, copy_of: qwen2.5}\n", "models.qwen2.5.copy_of", "2:3"},
		{"dotted model name value", "models:\n  qwen2.5: {role: actor, path: m}\n  qwen2: {role: ref, copy_of: qwen2.5}\n", "models.qwen2.5.role", "2:19"},
		{"absent dotted model", "models:\n  qwen2.5: {role: actor, path: m}\n  qwen2: {role: ref, copy_of: qwen2.5}\n", "models.qwen2.6.path", "1:1"},
		{"block scalar", "stages:\n  step:\n    - id: a\n      uses: b\n      when: |\n        step > 2\n", "stages.step[0].when", "5:13"},
	}
	for _, tt := range tests {
		base := minimal
		if tt.name == "alias value" || tt.name == "anchored value" {
			base = strings.Replace(minimal, "path: m", "path: &p m", 1)
		}
		src, start := mergeTop(base, tt.extra)
		s, err := Parse("a.yaml", []byte(src))
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		want := atPos("a.yaml", tt.pos)
		if lc, ok := strings.CutPrefix(tt.pos, "="); ok {
			want = atPos("a.yaml", lc)
		} else {
			want.Line += start - 1
		}
		if got := s.At(tt.path); got != want {
			t.Errorf("%s: At(%q) = %v, want %v\n%s", tt.name, tt.path, got, want, src)
		}
	}
}

func TestParentPath(t *testing.T) {
	tests := []struct{ path, parent string }{
		{"mesh.gpu", "mesh"},
		{"mesh", ""},
		{"", ""},
		{"train.betas[1]", "train.betas"},
		{"stages.step[0].needs[2]", "stages.step[0].needs"},
		{"stages.step[0].with.a.b", "stages.step[0].with.a"},
		{"models.actor.path", "models.actor"},
		{"models.qwen2.5.copy_of", "models.qwen2.5"},
		{"models.qwen2.5", "models"},
		{"models.actor", "models"},
		{"models.path", "models"},
	}
	for _, tt := range tests {
		if got := parentPath(tt.path); got != tt.parent {
			t.Errorf("parentPath(%q) = %q, want %q", tt.path, got, tt.parent)
		}
	}
}
