package reward

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/vm"
)

// ExprError is an error in a reward expression found by New. Offset is the
// 0-based byte offset in Expr of the character the error is about (0 when
// the error is about the expression as a whole, such as its result type), so
// the caller can point at it in the YAML.
type ExprError struct {
	Expr   string
	Offset int
	Msg    string
}

// Error implements error.
func (e *ExprError) Error() string {
	return fmt.Sprintf("reward.expr: %s (at byte %d of %q)", e.Msg, e.Offset, e.Expr)
}

// exprEnv is the environment a reward expression is compiled against and
// evaluated in, one value per sample.
type exprEnv struct {
	Response       []int          `expr:"response"`
	Prompt         []int          `expr:"prompt"`
	ResponseLength int            `expr:"response_length"`
	PromptLength   int            `expr:"prompt_length"`
	Finish         string         `expr:"finish"`
	Label          map[string]any `expr:"label"`
	Group          int            `expr:"group"`
}

// exprNames returns the names of the expression environment.
func exprNames() []string {
	t := reflect.TypeFor[exprEnv]()
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		names = append(names, t.Field(i).Tag.Get("expr"))
	}
	return names
}

// exprScorer scores each sample with one compiled expression.
type exprScorer struct {
	src  string
	prog *vm.Program
}

var unknownNameRE = regexp.MustCompile(`^unknown name ([\pL_][\pL\pN_]*)$`)

// newExprScorer compiles src against exprEnv and checks its result type.
func newExprScorer(src string) (s Scorer, err error) {
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, &ExprError{Expr: src, Msg: fmt.Sprintf("internal error compiling the expression: %v", r)}
		}
	}()
	prog, err := expr.Compile(src, expr.Env(exprEnv{}))
	if err != nil {
		var fe *file.Error
		if !errors.As(err, &fe) {
			return nil, &ExprError{Expr: src, Msg: err.Error()}
		}
		msg := fe.Message
		if m := unknownNameRE.FindStringSubmatch(msg); m != nil {
			if near := closest(m[1], exprNames()); near != "" {
				msg += fmt.Sprintf(" (did you mean %s?)", near)
			}
		}
		return nil, &ExprError{Expr: src, Offset: byteOffset(src, fe.From), Msg: msg}
	}
	if t := prog.Node().Type(); t != nil && !resultKindOK(t.Kind()) {
		return nil, &ExprError{Expr: src, Msg: fmt.Sprintf("expression must return a number or a bool, not %s", t)}
	}
	return &exprScorer{src: src, prog: prog}, nil
}

// resultKindOK reports whether an expression of static kind k may yield a
// reward: a number, a bool, or a type only known at run time.
func resultKindOK(k reflect.Kind) bool {
	switch k {
	case reflect.Bool, reflect.Interface,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		return true
	}
	return false
}

// byteOffset converts expr-lang's rune offset in src to a byte offset,
// clamped to len(src).
func byteOffset(src string, runes int) int {
	if runes <= 0 {
		return 0
	}
	n := 0
	for i := range src {
		if n == runes {
			return i
		}
		n++
	}
	return len(src)
}

// Score implements Scorer.
func (s *exprScorer) Score(ctx context.Context, samples []Sample) ([]float64, error) {
	out := make([]float64, len(samples))
	var machine vm.VM
	for i := range samples {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		r, err := s.one(&machine, &samples[i])
		if err != nil {
			return nil, fmt.Errorf("reward expression %q: sample %d: %w", s.src, samples[i].Index, err)
		}
		out[i] = r
	}
	return out, nil
}

// one evaluates the expression for one sample.
func (s *exprScorer) one(machine *vm.VM, smp *Sample) (float64, error) {
	env := exprEnv{
		Response:       ints(smp.Response),
		Prompt:         ints(smp.Prompt),
		ResponseLength: len(smp.Response),
		PromptLength:   len(smp.Prompt),
		Finish:         smp.Finish,
		Label:          smp.Labels,
		Group:          smp.Group,
	}
	if env.Label == nil {
		env.Label = map[string]any{}
	}
	v, err := machine.Run(s.prog, env)
	if err != nil {
		var fe *file.Error
		if errors.As(err, &fe) {
			return 0, fmt.Errorf("%s (at byte %d)", fe.Message, byteOffset(s.src, fe.From))
		}
		return 0, err
	}
	r, ok := toFloat(v)
	if !ok {
		return 0, fmt.Errorf("expression returned %s, want a number or a bool", describeValue(v))
	}
	if err := checkFinite(r); err != nil {
		return 0, err
	}
	return r, nil
}

// ints widens token ids for the expression environment.
func ints(ids []int32) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out
}

// toFloat converts an expression result to a reward.
func toFloat(v any) (float64, bool) {
	switch v := v.(type) {
	case bool:
		if v {
			return 1, true
		}
		return 0, true
	case int:
		return float64(v), true
	case int8:
		return float64(v), true
	case int16:
		return float64(v), true
	case int32:
		return float64(v), true
	case int64:
		return float64(v), true
	case uint:
		return float64(v), true
	case uint8:
		return float64(v), true
	case uint16:
		return float64(v), true
	case uint32:
		return float64(v), true
	case uint64:
		return float64(v), true
	case uintptr:
		return float64(v), true
	case float32:
		return float64(v), true
	case float64:
		return v, true
	}
	return 0, false
}

// describeValue names a value of the wrong type in an error message.
func describeValue(v any) string {
	if v == nil {
		return "nil"
	}
	s := fmt.Sprintf("%v", v)
	if len(s) > 40 {
		s = strings.ToValidUTF8(s[:40], "") + "..."
	}
	if _, ok := v.(string); ok {
		s = fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%T %s", v, s)
}
