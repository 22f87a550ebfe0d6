package spec

import (
	"strings"

	"go.yaml.in/yaml/v3"
)

// sourceLines returns the lines of a file registered with RegisterSource.
func sourceLines(file string) []string {
	sources.RLock()
	defer sources.RUnlock()
	return sources.m[file]
}

// ValuePos returns the file position of the rune at offset in the value of
// the scalar node n, accounting for the scalar's style: the opening quote of
// quoted scalars, escapes ("\x41", "\u00e9", ”), line folding of multi-line
// flow and folded scalars, and the indentation of block scalars (| and >),
// whose value starts on the line after the indicator. An offset equal to the
// length of the value points just past its last rune.
//
// The exact mapping needs the file's text, registered with RegisterSource
// (Parse does this); without it ValuePos assumes the value sits on one line.
func ValuePos(file string, n *yaml.Node, offset int) Pos {
	n = resolve(n)
	if n == nil {
		return Pos{File: file}
	}
	if offset < 0 {
		offset = 0
	}
	line, col := valuePos(sourceLines(file), n, offset)
	return Pos{File: file, Line: line, Col: col}
}

// valuePos implements ValuePos on the lines of the file.
func valuePos(lines []string, n *yaml.Node, offset int) (line, col int) {
	style := n.Style &^ (yaml.TaggedStyle | yaml.FlowStyle)
	switch style {
	case yaml.LiteralStyle:
		return literalPos(lines, n, offset)
	case yaml.FoldedStyle:
		indent, ok := blockIndent(lines, n.Line)
		if !ok {
			return n.Line, n.Column
		}
		return flowPos(lines, n.Line+1, indent+1, 0, true, indent, offset)
	case yaml.DoubleQuotedStyle:
		return flowPos(lines, n.Line, n.Column+1, '"', false, 0, offset)
	case yaml.SingleQuotedStyle:
		return flowPos(lines, n.Line, n.Column+1, '\'', false, 0, offset)
	default:
		return flowPos(lines, n.Line, n.Column, 0, false, 0, offset)
	}
}

// blockIndent returns the indentation of the content of the block scalar
// whose indicator is on line header: that of its first non-blank line.
func blockIndent(lines []string, header int) (int, bool) {
	for i := header; i < len(lines); i++ { // lines[header] is the line after the header
		l := lines[i]
		if strings.TrimSpace(l) == "" {
			continue
		}
		return len(l) - len(strings.TrimLeft(l, " ")), true
	}
	return 0, false
}

// literalPos maps an offset in a literal block scalar: value lines are the
// file's lines after the header, less the indentation.
func literalPos(lines []string, n *yaml.Node, offset int) (int, int) {
	indent, ok := blockIndent(lines, n.Line)
	if !ok {
		return n.Line, n.Column
	}
	line, col := n.Line+1, 0
	for _, r := range n.Value {
		if offset == 0 {
			break
		}
		offset--
		if r == '\n' {
			line++
			col = 0
		} else {
			col++
		}
	}
	return line, indent + col + 1
}

// flowPos walks the raw text of a scalar from line:col (1-based, the first
// rune of the value) until offset runes of the value have been produced.
// quote is the quote character of a quoted scalar, or 0. In a block scalar
// continuation lines start after indent columns and trailing blanks are
// content; in flow scalars leading and trailing blanks of lines are folded.
func flowPos(lines []string, line, col int, quote rune, block bool, indent, offset int) (int, int) {
	if line < 1 || line > len(lines) {
		return line, col + offset
	}
	l := line - 1
	runes := []rune(lines[l])
	c := col - 1
	if c < 0 {
		c = 0
	}
	escapedBreak := false
	for v := 0; ; {
		if v >= offset {
			// Stop unless the raw text here produces no value: an escaped
			// line break or blanks before a line break.
			switch {
			case c >= len(runes) && !escapedBreak:
				return l + 1, c + 1
			case c < len(runes) && !(quote == '"' && runes[c] == '\\' && c+1 >= len(runes)) &&
				!(!block && isBlank(runes[c]) && restBlank(runes[c:])):
				return l + 1, c + 1
			}
		}
		if c >= len(runes) {
			// A line break: skip blank lines and fold.
			blanks, next := 0, l+1
			for next < len(lines) && strings.TrimSpace(lines[next]) == "" {
				blanks++
				next++
			}
			if next >= len(lines) {
				return l + 1, c + 1
			}
			l, runes = next, []rune(lines[next])
			if block {
				c = min(indent, len(runes))
			} else {
				c = 0
				for c < len(runes) && (runes[c] == ' ' || runes[c] == '\t') {
					c++
				}
			}
			switch {
			case escapedBreak:
				escapedBreak = false
			case blanks > 0:
				v += blanks
			default:
				v++
			}
			continue
		}
		r := runes[c]
		switch {
		case quote == '\'' && r == '\'':
			if c+1 < len(runes) && runes[c+1] == '\'' {
				c += 2
				v++
				continue
			}
			return l + 1, c + 1
		case quote == '"' && r == '"':
			return l + 1, c + 1
		case quote == '"' && r == '\\':
			if c+1 >= len(runes) {
				escapedBreak = true
				c = len(runes)
				continue
			}
			switch runes[c+1] {
			case 'x':
				c += 4
			case 'u':
				c += 6
			case 'U':
				c += 10
			default:
				c += 2
			}
			v++
		case !block && (r == ' ' || r == '\t'):
			j := c
			for j < len(runes) && (runes[j] == ' ' || runes[j] == '\t') {
				j++
			}
			if j == len(runes) {
				c = j // trailing blanks are folded away
				continue
			}
			c++
			v++
		default:
			c++
			v++
		}
	}
}

func isBlank(r rune) bool { return r == ' ' || r == '\t' }

// restBlank reports whether rs holds only blanks.
func restBlank(rs []rune) bool {
	for _, r := range rs {
		if !isBlank(r) {
			return false
		}
	}
	return true
}
