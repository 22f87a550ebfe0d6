package spec

import (
	"encoding/json"
	"strings"
	"testing"
)

// autoCase is one decoding of `v: ...` into an auto parameter.
type autoCase[T comparable] struct {
	src  string
	want T
	err  string // "line:col message" substring; "" for none
	json string // the struct marshalled; "" not checked
}

// testAutoDecode decodes each case's source into a struct whose field v
// starts as init, and checks the value, the error and the JSON.
func testAutoDecode[T comparable](t *testing.T, init T, tests []autoCase[T]) {
	t.Helper()
	type with struct {
		V T `yaml:"v"`
	}
	for _, tt := range tests {
		w := with{V: init}
		errs := DecodeStrictIn("a.yaml", node(t, "a.yaml", tt.src), &w, "with")
		switch {
		case tt.err == "" && errs != nil:
			t.Errorf("%q: %v", tt.src, errs)
		case tt.err != "" && (len(errs) != 1 || !strings.Contains(posLC(errs[0].Pos)+": "+errs[0].Msg, tt.err)):
			t.Errorf("%q: errors %v, want %q", tt.src, errs, tt.err)
		}
		if w.V != tt.want {
			t.Errorf("%q: decoded %v, want %v", tt.src, w.V, tt.want)
		}
		if tt.json != "" {
			b, err := json.Marshal(w)
			if err != nil || string(b) != tt.json {
				t.Errorf("%q: json %s (%v), want %s", tt.src, b, err, tt.json)
			}
		}
	}
}

func TestAutoInt(t *testing.T) {
	testAutoDecode(t, AutoInt(7), []autoCase[AutoInt]{
		{"v: auto\n", Auto, "", `{"V":"auto"}`},
		{"v: 'auto'\n", Auto, "", `{"V":"auto"}`},
		{"v: 2048\n", 2048, "", `{"V":2048}`},
		{"v: 0\n", 0, "", `{"V":0}`},
		{"{}\n", 7, "", `{"V":7}`}, // the default survives
		{"v: -1\n", 7, "1:4: with.v: must not be negative, got -1 (write auto to let rlpipe choose)", ""},
		{"v: Auto\n", 7, `1:4: with.v: want an integer or auto, got string "Auto"`, ""},
		{"v: 1.5\n", 7, "1:4: with.v: want an integer or auto, got float 1.5", ""},
		{"v: 99999999999999999999\n", 7, "1:4: with.v: integer 99999999999999999999 out of range", ""},
		{"v: [1]\n", 7, "1:4: with.v: want an integer or auto, got a list", ""},
	})
}

func TestAutoBool(t *testing.T) {
	testAutoDecode(t, BoolAuto, []autoCase[AutoBool]{
		{"v: auto\n", BoolAuto, "", `{"V":"auto"}`},
		{"v: true\n", AutoBoolOf(true), "", `{"V":true}`},
		{"v: false\n", AutoBoolOf(false), "", `{"V":false}`},
		{"{}\n", BoolAuto, "", `{"V":"auto"}`}, // the default survives
		{"v: 1\n", BoolAuto, "1:4: with.v: want true, false or auto, got integer 1", ""},
		{"v: 'true'\n", BoolAuto, `1:4: with.v: want true, false or auto, got string "true"`, ""},
		{"v: Auto\n", BoolAuto, `1:4: with.v: want true, false or auto, got string "Auto"`, ""},
		{"v: [true]\n", BoolAuto, "1:4: with.v: want true, false or auto, got a list", ""},
	})
}
