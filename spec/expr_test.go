package spec

import (
	"reflect"
	"strings"
	"testing"
)

// TestValuePos checks that offsets inside scalars of every style map to the
// right file positions. Each case marks the expected rune with the value's
// character at that offset.
func TestValuePos(t *testing.T) {
	tests := []struct {
		name      string
		src       string // "k: <scalar>"
		offset    int
		line, col int
	}{
		{"plain trailing blanks", "k: ab  \n  cd\n", 2, 1, 8},
		{"plain trailing blanks next", "k: ab  \n  cd\n", 3, 2, 3},
		{"plain", "k: abc def\n", 4, 1, 8},
		{"plain start", "k: abc\n", 0, 1, 4},
		{"plain end", "k: abc\n", 3, 1, 7},
		{"double quoted", "k: \"abc def\"\n", 4, 1, 9},
		{"double escapes", "k: \"\\x61\\u00e9\\\"d\"\n", 3, 1, 17},
		{"single quoted", "k: 'a''b c'\n", 4, 1, 10},
		{"unicode", "k: \"é = x\"\n", 4, 1, 9},
		{"multi-line plain", "k: ab\n  cd\n", 3, 2, 3},
		{"multi-line plain blank", "k: ab\n\n   cd\n", 3, 3, 4},
		{"multi-line double", "k: \"ab \n  cd\"\n", 4, 2, 4},
		{"double escaped break", "k: \"ab\\\n  cd\"\n", 2, 2, 3},
		{"literal", "k: |\n  ab\n  cd\n", 4, 3, 4},
		{"literal indented", "k: |\n    ab\n      cd\n", 5, 3, 7},
		{"literal keep", "k: |+\n  ab\n\n  cd\n", 4, 4, 3},
		{"folded", "k: >\n  ab\n  cd\n", 4, 3, 4},
		{"folded strip", "k: >-\n  ab\n\n  cd\n", 3, 4, 3},
		{"flow mapping", "k: {x: abc}\n", 2, 1, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := "vp-" + tt.name
			n := node(t, file, tt.src).Content[0].Content[1]
			if tt.name == "flow mapping" {
				n = n.Content[1]
			}
			got := ValuePos(file, n, tt.offset)
			if got.Line != tt.line || got.Col != tt.col {
				t.Errorf("ValuePos(%q, %d) = %d:%d, want %d:%d (value %q)", tt.src, tt.offset, got.Line, got.Col, tt.line, tt.col, n.Value)
			}
		})
	}
}

// TestCompileNodePositions checks that expression errors point inside the
// YAML string: inside quotes and inside a block scalar.
func TestCompileNodePositions(t *testing.T) {
	src := `quoted: "layer.index == 0 || lyr.is_last"
block: |
  layer.index == 0 ||
    layer.is_lst
kind: 'layer.index'
`
	root := node(t, "cn.yaml", src).Content[0]
	tests := []struct {
		key  string
		kind reflect.Kind
		want string
	}{
		{"quoted", reflect.Bool, `cn.yaml:1:30: quoted: unknown name lyr (did you mean "layer"?)`},
		{"block", reflect.Bool, `cn.yaml:4:11: block: layer has no field is_lst (did you mean "is_last"?)`},
		{"kind", reflect.Bool, `cn.yaml:5:8: kind: expression must return a bool: expected bool, but got int`},
		{"kind", reflect.String, `cn.yaml:5:8: kind: expression must return a string: expected string, but got int`},
	}
	for _, tt := range tests {
		var n = root
		for i := 0; i+1 < len(root.Content); i += 2 {
			if root.Content[i].Value == tt.key {
				n = root.Content[i+1]
			}
		}
		_, err := CompileNode("cn.yaml", n, tt.kind, tt.key)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: got %v, want %s", tt.key, err, tt.want)
		}
		if _, ok := err.(*Error); !ok {
			t.Errorf("%s: error is %T, want *Error", tt.key, err)
		}
	}
}

func TestCompile(t *testing.T) {
	pos := Pos{File: "c.yaml", Line: 3, Col: 10}
	tests := []struct {
		src  string
		kind reflect.Kind
		want string // error; empty for success
	}{
		{"step > 1", reflect.Bool, ""},
		{`layer.is_last ? "fp32" : "bf16"`, reflect.String, ""},
		{"step > lyr", reflect.Bool, "c.yaml:3:17: unknown name lyr"},
		{"step >\n  lyr", reflect.Bool, "c.yaml:4:3: unknown name lyr"},
		{"step", reflect.Bool, "c.yaml:3:10: expression must return a bool"},
		{"step", reflect.Invalid, "internal error"},
		{"", reflect.Bool, "c.yaml:3:10:"},
	}
	for _, tt := range tests {
		e, err := Compile(tt.src, pos, tt.kind)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q: %v", tt.src, err)
		case tt.want == "" && (e == nil || e.Src != tt.src || e.Pos != pos):
			t.Errorf("%q: expr %+v", tt.src, e)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q: got %v, want %q", tt.src, err, tt.want)
		}
	}
}

func TestEval(t *testing.T) {
	pos := Pos{File: "ev.yaml", Line: 1, Col: 1}
	b, _ := Compile("mesh.world_size > 1 && model.trainable", pos, reflect.Bool)
	s, _ := Compile(`model.family + "/" + stage.kind`, pos, reflect.String)
	div, _ := Compile("1 / step > 0", pos, reflect.Bool)
	if got, err := b.Bool(&Env{Mesh: MeshEnv{WorldSize: 2}, Model: ModelEnv{Trainable: true}}); err != nil || !got {
		t.Errorf("Bool = %v, %v", got, err)
	}
	if got, err := b.Bool(nil); err != nil || got {
		t.Errorf("Bool(nil) = %v, %v", got, err)
	}
	if got, err := s.String(&Env{Model: ModelEnv{Family: "qwen2"}, Stage: StageEnv{Kind: "train"}}); err != nil || got != "qwen2/train" {
		t.Errorf("String = %q, %v", got, err)
	}
	if got, err := div.Bool(&Env{}); err != nil || !got { // 1/0 is +Inf in expr
		t.Errorf("div = %v, %v", got, err)
	}
	var none *Expr
	if got, err := none.BoolOr(nil, true); err != nil || !got {
		t.Errorf("BoolOr = %v, %v", got, err)
	}
	if got, err := none.StringOr(nil, "bf16"); err != nil || got != "bf16" {
		t.Errorf("StringOr = %q, %v", got, err)
	}
	if _, err := none.Bool(nil); err == nil {
		t.Error("nil Bool: no error")
	}
	if _, err := b.String(&Env{}); err == nil || !strings.Contains(err.Error(), "want string") {
		t.Errorf("String on bool: %v", err)
	}
	p, _ := Compile(`layer.is_first ? "fp32" : layer.is_last ? "bf16" : model.name`, pos, reflect.String)
	if vals, offs := p.StringResults(); !reflect.DeepEqual(vals, []string{"fp32", "bf16"}) || !reflect.DeepEqual(offs, []int{17, 42}) {
		t.Errorf("StringResults = %q %v", vals, offs)
	}
}

func TestErrorsFormat(t *testing.T) {
	RegisterSource("f.yaml", []byte("a: 1\r\n\tb:  2  \nc: 3\n"))
	es := Errors{
		Errorf(Pos{File: "f.yaml", Line: 3, Col: 1}, "third"),
		Errorf(Pos{File: "f.yaml", Line: 2, Col: 3}, "tab %d", 2),
		Errorf(Pos{File: "f.yaml"}, "no line"),
		Errorf(Pos{}, "no position"),
		Errorf(Pos{File: "other.yaml", Line: 9, Col: 2}, "unknown source"),
		Errorf(Pos{File: "f.yaml", Line: 99, Col: 1}, "line past the end"),
	}
	err := es.Err()
	want := `no position
f.yaml: no line
f.yaml:2:3: tab 2
     2 | 	b:  2
       | 	 ^
f.yaml:3:1: third
     3 | c: 3
       | ^
f.yaml:99:1: line past the end
other.yaml:9:2: unknown source`
	if err == nil || err.Error() != want {
		t.Errorf("got:\n%v\nwant:\n%s", err, want)
	}
	if (Errors{}).Err() != nil || Errors(nil).Err() != nil {
		t.Error("empty Errors is not a nil error")
	}
	var all Errors
	all.Append(nil)
	all.Append(es)
	all.Append(Errorf(Pos{}, "one"))
	all.Append(strings.NewReader("").UnreadByte())
	all.Addf(Pos{}, "added")
	if len(all) != len(es)+3 || all[len(all)-2].Msg != "strings.Reader.UnreadByte: at beginning of string" {
		t.Errorf("Append: %d errors: %v", len(all), all)
	}
}
