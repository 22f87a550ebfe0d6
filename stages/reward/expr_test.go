package reward

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// exprSamples are two crafted samples for the expression tests.
func exprSamples() []Sample {
	return []Sample{
		{Index: 10, Group: 0, Prompt: []int32{5, 6}, Response: []int32{1, 100, 3, 70}, Finish: "stop",
			Labels: map[string]any{"answer": 3.0, "name": "x", "tags": []any{"a", "b"}}},
		{Index: 11, Group: 1, Response: []int32{200, 300}, Finish: "length",
			Labels: map[string]any{"answer": 4.0}},
	}
}

func TestExprScore(t *testing.T) {
	tests := []struct {
		src  string
		want []float64
	}{
		{`count(response, # < 64) / len(response)`, []float64{0.5, 0}},
		{`finish == "stop" ? 1 : 0`, []float64{1, 0}},
		{`label.answer == 3`, []float64{1, 0}},
		{`label["answer"] * 2`, []float64{6, 8}},
		{`label.missing == nil ? 0.25 : 1`, []float64{0.25, 0.25}},
		{`len(label.tags ?? [])`, []float64{2, 0}},
		{`response_length + 10 * prompt_length + 100 * group`, []float64{24, 102}},
		{`sum(response)`, []float64{174, 500}},
		{`response[0] - len(prompt)`, []float64{-1, 200}},
		{`response_length > 3`, []float64{1, 0}},
		{`-1.5`, []float64{-1.5, -1.5}},
	}
	for _, tt := range tests {
		t.Run(tt.src, func(t *testing.T) {
			s, err := New(Config{Expr: tt.src})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			got, err := s.Score(context.Background(), exprSamples())
			if err != nil {
				t.Fatalf("Score: %v", err)
			}
			if !equalFloats(got, tt.want) {
				t.Fatalf("Score = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestExprNilLabels(t *testing.T) {
	s, err := New(Config{Expr: `label.answer == nil && len(label) == 0`})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Score(context.Background(), []Sample{{Finish: "stop"}})
	if err != nil {
		t.Fatal(err)
	}
	if !equalFloats(got, []float64{1}) {
		t.Fatalf("Score = %v, want [1]", got)
	}
}

func TestExprCompileErrors(t *testing.T) {
	tests := []struct {
		src    string
		offset int
		want   []string
	}{
		{`count(respons, # < 64)`, 6, []string{"unknown name respons", "did you mean response?"}},
		{`"é" == respons`, 8, []string{"unknown name respons"}}, // é is 2 bytes, 1 rune
		{`finsh == "stop"`, 0, []string{"did you mean finish?"}},
		{`group.x`, 6, []string{"no field x"}},
		{`1 +`, 2, []string{"unexpected token EOF"}},
		{`finish`, 0, []string{"must return a number or a bool, not string"}},
		{`response`, 0, []string{"must return a number or a bool, not []int"}},
		{`"a" + finish`, 0, []string{"not string"}},
	}
	for _, tt := range tests {
		t.Run(tt.src, func(t *testing.T) {
			_, err := New(Config{Expr: tt.src})
			var ee *ExprError
			if !errors.As(err, &ee) {
				t.Fatalf("New error %v (%T), want an *ExprError", err, err)
			}
			if ee.Offset != tt.offset {
				t.Errorf("offset %d, want %d (%v)", ee.Offset, tt.offset, err)
			}
			if ee.Expr != tt.src {
				t.Errorf("Expr %q, want %q", ee.Expr, tt.src)
			}
			for _, w := range tt.want {
				if !strings.Contains(ee.Msg, w) {
					t.Errorf("message %q does not contain %q", ee.Msg, w)
				}
			}
		})
	}
}

func TestExprRunErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{"run-time error names the sample", `label.answer > 3 ? label.nope.x : 1`, []string{"sample 11:", "cannot fetch x"}},
		{"string result", `label.name`, []string{"sample 10:", `returned string "x", want a number or a bool`}},
		{"nil result", `label.nope`, []string{"sample 10:", "returned nil"}},
		{"infinite result", `1 / (response_length - 4)`, []string{"sample 10:", "non-finite reward +Inf"}},
		{"nan result", `count(response, # < 64) / prompt_length`, []string{"sample 11:", "non-finite reward NaN"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(Config{Expr: tt.src})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			_, err = s.Score(context.Background(), exprSamples())
			if err == nil {
				t.Fatal("Score succeeded, want an error")
			}
			for _, w := range append(tt.want, tt.src) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestExprCanceled(t *testing.T) {
	s, err := New(Config{Expr: `1`})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Score(ctx, exprSamples()); !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
}

func TestByteOffset(t *testing.T) {
	tests := []struct {
		src   string
		runes int
		want  int
	}{
		{"abc", 0, 0},
		{"abc", 2, 2},
		{"éa", 1, 2},
		{"éa", 2, 3},
		{"é", 5, 2},
		{"abc", -1, 0},
	}
	for _, tt := range tests {
		if got := byteOffset(tt.src, tt.runes); got != tt.want {
			t.Errorf("byteOffset(%q, %d) = %d, want %d", tt.src, tt.runes, got, tt.want)
		}
	}
}
