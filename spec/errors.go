package spec

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

// Error is one problem found in a spec file, with the position it refers to.
// A zero Pos.Line means the error has no position inside the file.
type Error struct {
	Pos Pos
	Msg string
}

// Errorf returns an *Error at pos with a message formatted as by fmt.Sprintf.
func Errorf(pos Pos, format string, args ...any) *Error {
	return &Error{Pos: pos, Msg: fmt.Sprintf(format, args...)}
}

// Error formats the error on one line as file:line:col: message.
func (e *Error) Error() string {
	switch {
	case e.Pos.Line > 0:
		return e.Pos.String() + ": " + e.Msg
	case e.Pos.File != "":
		return e.Pos.File + ": " + e.Msg
	default:
		return e.Msg
	}
}

// Snippet returns the source line the error points at, prefixed with its
// line number, and a caret under the column, e.g.
//
//	12 |   dpp: 8
//	   |   ^
//
// The line is taken from the sources registered with RegisterSource (Parse
// registers every file it reads). Snippet returns "" when the line is not
// known.
func (e *Error) Snippet() string {
	if e.Pos.Line <= 0 {
		return ""
	}
	line, ok := SourceLine(e.Pos.File, e.Pos.Line)
	if !ok {
		return ""
	}
	num := strconv.Itoa(e.Pos.Line)
	width := max(len(num), 6)
	var b strings.Builder
	fmt.Fprintf(&b, "%*s | %s\n", width, num, strings.TrimRight(line, " \t"))
	fmt.Fprintf(&b, "%*s | ", width, "")
	col := max(e.Pos.Col, 1)
	i := 1
	for _, r := range line {
		if i >= col {
			break
		}
		if r == '\t' {
			b.WriteByte('\t')
		} else {
			b.WriteByte(' ')
		}
		i++
	}
	b.WriteByte('^')
	return b.String()
}

// Errors is a list of problems, sorted by position by Sort. It implements
// error; a nil or empty Errors should not be returned as an error (use Err).
type Errors []*Error

// Error formats every error as file:line:col: message, followed by the
// offending source line and a caret under the column when the source is known.
func (es Errors) Error() string {
	var b strings.Builder
	for _, e := range es {
		if e == nil {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
		if s := e.Snippet(); s != "" {
			b.WriteByte('\n')
			b.WriteString(s)
		}
	}
	return b.String()
}

// Err returns es sorted as an error, or nil when es is empty.
func (es Errors) Err() error {
	if len(es) == 0 {
		return nil
	}
	es.Sort()
	return es
}

// Sort sorts the errors by file, line and column, keeping the order of errors
// at the same position.
func (es Errors) Sort() {
	sort.SliceStable(es, func(i, j int) bool {
		a, b := es[i].Pos, es[j].Pos
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Col < b.Col
	})
}

// Addf appends an error at pos.
func (es *Errors) Addf(pos Pos, format string, args ...any) {
	*es = append(*es, Errorf(pos, format, args...))
}

// Append appends err to es: every error of an Errors, an *Error as is, and
// any other error without a position. A nil err is ignored.
func (es *Errors) Append(err error) {
	if err == nil {
		return
	}
	var list Errors
	if errors.As(err, &list) {
		for _, e := range list {
			if e != nil {
				*es = append(*es, e)
			}
		}
		return
	}
	var one *Error
	if errors.As(err, &one) && one != nil {
		*es = append(*es, one)
		return
	}
	*es = append(*es, &Error{Msg: err.Error()})
}

// NodePos returns the position of a YAML node in file.
func NodePos(file string, n *yaml.Node) Pos {
	if n == nil {
		return Pos{File: file}
	}
	return Pos{File: file, Line: n.Line, Col: n.Column}
}

// sources holds the text of the files errors point into, by file name.
var sources = struct {
	sync.RWMutex
	m map[string][]string
}{m: map[string][]string{}}

// RegisterSource records the contents of file so that errors pointing into it
// can show the offending line. Parse calls it for every spec it reads; other
// packages only need it for files they parse themselves.
func RegisterSource(file string, data []byte) {
	lines := strings.Split(string(data), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSuffix(l, "\r")
	}
	sources.Lock()
	sources.m[file] = lines
	sources.Unlock()
}

// SourceLine returns line (1-based) of a file registered with RegisterSource.
func SourceLine(file string, line int) (string, bool) {
	sources.RLock()
	defer sources.RUnlock()
	lines, ok := sources.m[file]
	if !ok || line < 1 || line > len(lines) {
		return "", false
	}
	return lines[line-1], true
}
