package spec

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/vm"
	"go.yaml.in/yaml/v3"
)

// compileError is a failed compilation: the message and, when located, the
// rune offset in the source it points at.
type compileError struct {
	msg     string
	offset  int
	located bool
}

// kindName names a result kind in messages.
func kindName(kind reflect.Kind) string {
	switch kind {
	case reflect.Bool:
		return "a bool"
	case reflect.String:
		return "a string"
	default:
		return "a " + kind.String()
	}
}

// compile compiles src against Env, expecting a result of kind.
func compile(src string, kind reflect.Kind) (prog *vm.Program, cerr *compileError) {
	if kind == reflect.Invalid || kind == reflect.Interface {
		return nil, &compileError{msg: fmt.Sprintf("internal error: cannot compile an expression of kind %s", kind)}
	}
	defer func() {
		if r := recover(); r != nil {
			prog, cerr = nil, &compileError{msg: fmt.Sprintf("internal error compiling expression: %v", r)}
		}
	}()
	var opts []expr.Option
	opts = append(opts, expr.Env(Env{}))
	if kind == reflect.Bool {
		opts = append(opts, expr.AsBool())
	} else {
		opts = append(opts, expr.AsKind(kind))
	}
	opts = append(opts, expr.WarnOnAny()) // after As*: it needs the expected kind
	prog, err := expr.Compile(src, opts...)
	if err == nil {
		return prog, nil
	}
	var fe *file.Error
	if errors.As(err, &fe) {
		off := fe.From
		if n := len([]rune(src)); off > n {
			off = n
		}
		return nil, &compileError{msg: explain(fe.Message), offset: max(off, 0), located: true}
	}
	// The result-kind check reports no location: point at the start.
	return nil, &compileError{msg: fmt.Sprintf("expression must return %s: %v", kindName(kind), err)}
}

var (
	unknownNameRE = regexp.MustCompile(`^unknown name ([A-Za-z_][A-Za-z0-9_]*)$`)
	noFieldRE     = regexp.MustCompile(`^type spec\.([A-Za-z]+) has no field ([A-Za-z_][A-Za-z0-9_]*)$`)
)

// envNames returns the expr names of the fields of struct type t.
func envNames(t reflect.Type) []string {
	var names []string
	for i := 0; i < t.NumField(); i++ {
		if name := t.Field(i).Tag.Get("expr"); name != "" {
			names = append(names, name)
		}
	}
	return names
}

// explain rewrites expr-lang messages about unknown names in terms of the
// environment's names, with a suggestion when one is close.
func explain(msg string) string {
	if m := unknownNameRE.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("unknown name %s %s", m[1], suggest(m[1], envNames(reflect.TypeFor[Env]())))
	}
	if m := noFieldRE.FindStringSubmatch(msg); m != nil {
		et := reflect.TypeFor[Env]()
		for i := 0; i < et.NumField(); i++ {
			f := et.Field(i)
			if f.Type.Name() == m[1] && f.Type.Kind() == reflect.Struct {
				return fmt.Sprintf("%s has no field %s %s", f.Tag.Get("expr"), m[2], suggest(m[2], envNames(f.Type)))
			}
		}
	}
	return msg
}

// Compile compiles src against Env. kind is the result kind the expression
// must have: reflect.Bool or reflect.String. pos is the position of the first
// character of src; a compile error is an *Error positioned at the offending
// character, assuming src is written in the file as is (use CompileNode for a
// YAML scalar, which accounts for quoting and block scalars).
func Compile(src string, pos Pos, kind reflect.Kind) (*Expr, error) {
	prog, cerr := compile(src, kind)
	if cerr != nil {
		p := pos
		if cerr.located && pos.Line > 0 {
			line, col := 0, 0
			for i, r := range []rune(src) {
				if i == cerr.offset {
					break
				}
				if r == '\n' {
					line++
					col = 0
				} else {
					col++
				}
			}
			if line == 0 {
				p.Col += col
			} else {
				p.Line += line
				p.Col = col + 1
			}
		}
		return nil, &Error{Pos: p, Msg: cerr.msg}
	}
	return &Expr{Src: src, Pos: pos, Program: prog}, nil
}

// CompileNode compiles the expression held by the YAML scalar n of file.
// kind is reflect.Bool or reflect.String; what names the expression in
// messages (e.g. "policies.precision"). A compile error is an *Error
// positioned inside the YAML string, at the character expr-lang points at.
func CompileNode(file string, n *yaml.Node, kind reflect.Kind, what string) (*Expr, error) {
	n = resolve(n)
	if n == nil || n.Kind != yaml.ScalarNode || n.ShortTag() == "!!null" {
		return nil, Errorf(NodePos(file, n), "%s", label(what, "want an expression string, got "+describe(n)))
	}
	start := ValuePos(file, n, 0)
	prog, cerr := compile(n.Value, kind)
	if cerr != nil {
		p := start
		if cerr.located {
			p = ValuePos(file, n, cerr.offset)
		}
		return nil, &Error{Pos: p, Msg: label(what, cerr.msg)}
	}
	return &Expr{Src: n.Value, Pos: start, Program: prog}, nil
}

// StringResults returns the string literals an expression can return: the
// expression itself when it is a literal, and the literal branches of its
// conditionals (a ? "x" : "y", if/else), with their rune offsets in Src.
// It lets callers check values of string policies at load time.
func (e *Expr) StringResults() (values []string, offsets []int) {
	if e == nil || e.Program == nil {
		return nil, nil
	}
	var walk func(n ast.Node, depth int)
	walk = func(n ast.Node, depth int) {
		if n == nil || depth > 100 {
			return
		}
		switch n := n.(type) {
		case *ast.StringNode:
			values = append(values, n.Value)
			offsets = append(offsets, n.Location().From)
		case *ast.ConditionalNode:
			walk(n.Exp1, depth+1)
			walk(n.Exp2, depth+1)
		}
	}
	walk(e.Program.Node(), 0)
	return values, offsets
}

// run evaluates the expression against env; a nil env is the zero Env.
func (e *Expr) run(env *Env) (any, error) {
	if e == nil || e.Program == nil {
		return nil, errors.New("evaluating a nil expression")
	}
	if env == nil {
		env = &Env{}
	}
	out, err := expr.Run(e.Program, *env)
	if err != nil {
		return nil, Errorf(e.Pos, "evaluating %q: %v", e.Src, err)
	}
	return out, nil
}

// Bool evaluates a boolean expression.
func (e *Expr) Bool(env *Env) (bool, error) {
	out, err := e.run(env)
	if err != nil {
		return false, err
	}
	b, ok := out.(bool)
	if !ok {
		return false, Errorf(e.Pos, "%q returned %T, want bool", e.Src, out)
	}
	return b, nil
}

// String evaluates a string expression.
func (e *Expr) String(env *Env) (string, error) {
	out, err := e.run(env)
	if err != nil {
		return "", err
	}
	s, ok := out.(string)
	if !ok {
		return "", Errorf(e.Pos, "%q returned %T, want string", e.Src, out)
	}
	return s, nil
}

// BoolOr evaluates a boolean expression, or returns def when e is nil (the
// policy or `when` was not set).
func (e *Expr) BoolOr(env *Env, def bool) (bool, error) {
	if e == nil {
		return def, nil
	}
	return e.Bool(env)
}

// StringOr evaluates a string expression, or returns def when e is nil.
func (e *Expr) StringOr(env *Env, def string) (string, error) {
	if e == nil {
		return def, nil
	}
	return e.String(env)
}
