package spec

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"testing"
)

func TestSyntaxErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		pos  string // line:col of the offending token
		msg  string // the whole message
	}{
		{"ternary unquoted", "policies:\n  precision: layer.is_last ? \"fp32\" : \"bf16\"\n", "2:37",
			`invalid YAML: mapping values are not allowed in this context (quote values that contain ": ", such as a ? b : c expressions)`},
		{"ternary on line 1", "a: b ? c : d\n", "1:10", ""},
		{"second colon", "a: 1\nb: 2\nc: d: e\n", "3:5", ""},
		{"tab indentation", "version: 1\nmesh:\n\tdp: 1\n", "3:1",
			"invalid YAML: found character that cannot start any token (tabs are not allowed for indentation)"},
		{"tab after spaces", "mesh:\n  dp: 1\n  \tnodes: 1\n", "3:3", "invalid YAML: found a tab character that violates indentation"},
		{"over-indented key", "mesh:\n  dp: 1\n   gpus_per_node: 2\n", "3:17",
			`invalid YAML: mapping values are not allowed in this context (this line is indented more than the key above it, so it continues that key's value; indent sibling keys alike)`},
		{"under-indented key", "a:\n  b: 1\n c: 2\n", "3:2", "invalid YAML: did not find expected key"},
		{"over-indented after block", "a:\n  b:\n    c: 1\n   d: 2\n", "4:4", "invalid YAML: did not find expected key"},
		{"unclosed flow mapping at the end", "a: 1\nb: {c: 1, d: 2\n", "2:4", "invalid YAML: did not find expected ',' or '}'"},
		{"unclosed flow mapping before a key", "models:\n  actor: {path: m\ndata:\n  rollouts: r\n", "3:5",
			"invalid YAML: did not find expected ',' or '}'"},
		{"unclosed flow sequence", "version: 1\nname: [a\n", "2:7", "invalid YAML: did not find expected ',' or ']'"},
		{"unclosed outer sequence", "a: [[1, 2], 3\n", "1:4", ""},
		{"unclosed after a closed multi-line one", "a: [1,\n  2]\nb: [3\n", "3:4", ""},
		{"unclosed sequence on its own line", "a: [\n  1, 2\n# end\n", "1:4", ""},
		{"unclosed with a quoted key", "\"a b\": [1\n", "1:8", ""},
		{"unclosed with quoted entries", "b: {c: \"x, y\", d: 'z'\n", "1:4", ""},
		{"unclosed inside a list", "a:\n  - [1, {b: 2}\n", "2:5", ""},
		{"mismatched brackets", "a: [1, {b: 2]\n", "1:13", "invalid YAML: did not find expected ',' or '}'"},
		{"two quoted items", "a: [\"x\" \"y\"]\n", "1:9", ""},
		{"escaped quotes", "a: [\"x\\\"\" \"y\\\"\"]\n", "1:11", ""},
		{"doubled single quotes", "a: ['x' 'it''s']\n", "1:9", ""},
		{"unclosed double quote", "a: 1\nb: \"abc\nc: 2\n", "2:4", "invalid YAML: found unexpected end of stream"},
		{"unclosed single quote", "key: 'it''s\n", "1:6", "invalid YAML: found unexpected end of stream"},
		{"text after a quoted value", "a: 1\nb: 'x' y\n", "2:8", "invalid YAML: did not find expected key"},
		{"unknown anchor", "a: &x 1\nb: *y\n", "2:4", "invalid YAML: unknown anchor 'y' referenced"},
		{"reserved character", "a: 1\nb: `x`\n", "2:4", "invalid YAML: found character that cannot start any token"},
		{"unknown escape", "a: \"x\\q\"\n", "1:6", "invalid YAML: found unknown escape character"},
		{"key without colon", "a: 1\nb c\nd: 2\n", "2:1", "invalid YAML: could not find expected ':'"},
		{"list in a mapping", "a: 1\n- b\n", "2:1", "invalid YAML: did not find expected key"},
		{"second document", "a: 1\n---\nb: [\n", "3:4", "invalid YAML: did not find expected node content"},
		{"runes before the error", "é: 1\nb: é ? y : z\n", "2:10", ""},
		{"no final line break", "a: 1\nb: x ? y : z", "2:10", ""},
		{"CRLF", "a: 1\r\nb: x ? y : z\r\n", "2:10", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("y.yaml", []byte(tt.src))
			var es Errors
			if !errors.As(err, &es) || len(es) != 1 {
				t.Fatalf("want one error, got %v", err)
			}
			e := es[0]
			if got := posLC(e.Pos); got != tt.pos {
				t.Errorf("position %s, want %s (%s)\n%s", got, tt.pos, e.Msg, e.Snippet())
			}
			if !strings.HasPrefix(e.Msg, "invalid YAML: ") || tt.msg != "" && e.Msg != tt.msg {
				t.Errorf("message %q, want %q", e.Msg, tt.msg)
			}
		})
	}
}

// TestSyntaxPosProbes checks that locating an error in a 100 KB file parses
// a logarithmic number of prefixes, and still finds the token.
func TestSyntaxPosProbes(t *testing.T) {
	var b strings.Builder
	for i := 0; b.Len() < 100_000; i++ {
		fmt.Fprintf(&b, "key%d:\n  a: [1, 2, 3]\n  b: {c: \"x\", d: 'y'}\n  e: some plain text here\n", i)
	}
	body := b.String()
	lines := strings.Count(body, "\n")
	tests := []struct {
		name, src string
		line, col int
	}{
		{"at the end", body + "z: x ? y : z\n", lines + 1, 10},
		{"in the middle", body[:len(body)/2-len(body)/2%100] + "", 0, 0}, // replaced below
		{"unclosed at the end", body + "z: [1, 2\n", lines + 1, 4},
	}
	// An error in the middle: an over-indented key after the line
	// "  e: some plain text here" closest to the middle.
	mid := strings.Index(body[len(body)/2:], "  e: some plain text here\n") + len(body)/2 + len("  e: some plain text here\n")
	tests[1].src = body[:mid] + "   f: 1\n" + body[mid:]
	tests[1].line, tests[1].col = strings.Count(body[:mid], "\n")+1, 5
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := []byte(tt.src)
			err := syntaxError(data)
			if err == nil {
				t.Fatal("no syntax error")
			}
			m := yamlErrorRE.FindStringSubmatch(err.Error())
			for _, near := range []int{0, tt.line, tt.line + 1} {
				probes := 0
				line, col, ok := syntaxPos(data, m[2], near, func(p []byte) error { probes++; return syntaxError(p) })
				if !ok || line != tt.line || col != tt.col {
					t.Errorf("near %d: located %d:%d (%v), want %d:%d", near, line, col, ok, tt.line, tt.col)
				}
				// Two parses per probe at most (with and without closing
				// brackets): two for each step of the search by lines,
				// which doubles then halves, one for each of the bisection
				// of the line and the first checks.
				limit := 2 * (2*bits.Len(uint(lines+1)) + bits.Len(uint(100)) + 3)
				if probes > limit {
					t.Errorf("near %d: %d parses of prefixes, want at most %d", near, probes, limit)
				}
			}
		})
	}
}

func TestSyntaxPosUnlocated(t *testing.T) {
	data := []byte("a: [1\n")
	if _, _, ok := syntaxPos(data, "some other message", 1, syntaxError); ok {
		t.Error("located a message the data does not produce")
	}
	if _, _, ok := syntaxPos([]byte("\xff\xfea\x00:\x00"), "x", 0, func([]byte) error { return errors.New("yaml: x") }); ok {
		t.Error("located an error in UTF-16")
	}
	// Without a location, the error falls back to the line the library
	// names, at its first non-blank.
	d := &decoder{file: "u.yaml"}
	src := []byte("a:\n  b: 1\n    c\n")
	RegisterSource("u.yaml", src)
	d.yamlError(src, errors.New("yaml: line 3: something odd"))
	if len(d.errs) != 1 || d.errs[0].Error() != "u.yaml:3:5: invalid YAML: something odd" {
		t.Errorf("fallback: %v", d.errs)
	}
}
