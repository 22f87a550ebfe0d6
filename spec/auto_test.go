package spec

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestAutoInt(t *testing.T) {
	type with struct {
		Chunk AutoInt `yaml:"chunk"`
	}
	tests := []struct {
		src  string
		want AutoInt
		err  string // "line:col message" substring; "" for none
		json string
	}{
		{"chunk: auto\n", Auto, "", `{"Chunk":"auto"}`},
		{"chunk: 'auto'\n", Auto, "", `{"Chunk":"auto"}`},
		{"chunk: 2048\n", 2048, "", `{"Chunk":2048}`},
		{"chunk: 0\n", 0, "", `{"Chunk":0}`},
		{"{}\n", 7, "", `{"Chunk":7}`}, // the default survives
		{"chunk: -1\n", 7, "1:8: with.chunk: must not be negative, got -1 (write auto to let rlpipe choose)", ""},
		{"chunk: Auto\n", 7, `1:8: with.chunk: want an integer or auto, got string "Auto"`, ""},
		{"chunk: 1.5\n", 7, "1:8: with.chunk: want an integer or auto, got float 1.5", ""},
		{"chunk: 99999999999999999999\n", 7, "1:8: with.chunk: integer 99999999999999999999 out of range", ""},
		{"chunk: [1]\n", 7, "1:8: with.chunk: want an integer or auto, got a list", ""},
	}
	for _, tt := range tests {
		w := with{Chunk: 7}
		errs := DecodeStrictIn("a.yaml", node(t, "a.yaml", tt.src), &w, "with")
		switch {
		case tt.err == "" && errs != nil:
			t.Errorf("%q: %v", tt.src, errs)
		case tt.err != "" && (len(errs) != 1 || !strings.Contains(posLC(errs[0].Pos)+": "+errs[0].Msg, tt.err)):
			t.Errorf("%q: errors %v, want %q", tt.src, errs, tt.err)
		}
		if w.Chunk != tt.want {
			t.Errorf("%q: decoded %v, want %v", tt.src, w.Chunk, tt.want)
		}
		if tt.json != "" {
			b, err := json.Marshal(w)
			if err != nil || string(b) != tt.json {
				t.Errorf("%q: json %s (%v), want %s", tt.src, b, err, tt.json)
			}
		}
	}
}
