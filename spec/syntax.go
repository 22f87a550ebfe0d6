package spec

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// decodeYAML decodes the next document, turning a panic of the YAML library
// into an error.
func decodeYAML(dec *yaml.Decoder, n *yaml.Node) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: internal error: %v", r)
		}
	}()
	return dec.Decode(n)
}

// parseYAML parses data as a single YAML document and returns its root node.
func (d *decoder) parseYAML(data []byte) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	err := decodeYAML(dec, &doc)
	if err == io.EOF || err == nil && len(doc.Content) == 0 {
		d.errs.Addf(Pos{File: d.file, Line: 1, Col: 1}, "empty spec")
		return nil
	}
	if err != nil {
		d.yamlError(data, err)
		return nil
	}
	var extra yaml.Node
	switch err := decodeYAML(dec, &extra); {
	case err == io.EOF:
	case err != nil:
		d.yamlError(data, err)
		return nil
	default:
		at := &extra
		if len(extra.Content) > 0 {
			at = extra.Content[0]
		}
		d.errorf(at, "a spec file holds one YAML document; found a second one")
	}
	return doc.Content[0]
}

// syntaxError returns the YAML error parseYAML meets in data, or nil: it
// reads the first document and, when that is not empty, the second one.
func syntaxError(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := decodeYAML(dec, &doc); err != nil || len(doc.Content) == 0 {
		if err == io.EOF {
			return nil
		}
		return err
	}
	var extra yaml.Node
	if err := decodeYAML(dec, &extra); err != io.EOF {
		return err
	}
	return nil
}

// yamlErrorRE splits an error of the YAML library into the line it names,
// if any, and the message.
var yamlErrorRE = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// yamlError records a syntax error of the YAML parser in data at the token
// it is about.
func (d *decoder) yamlError(data []byte, err error) {
	msg, libLine := err.Error(), 0
	if m := yamlErrorRE.FindStringSubmatch(msg); m != nil {
		msg = m[2]
		libLine, _ = strconv.Atoi(m[1])
	}
	pos := Pos{File: d.file, Line: 1, Col: 1}
	if line, col, ok := syntaxPos(data, msg, libLine, syntaxError); ok {
		pos.Line, pos.Col = line, col
	} else if libLine > 0 {
		// The library's line is that of the token or of the construct it
		// is in; guess the token is the line's first.
		pos.Line = libLine
		if text, ok := SourceLine(d.file, libLine); ok {
			pos.Col = utf8.RuneCountInString(text[:len(text)-len(strings.TrimLeft(text, " \t"))]) + 1
			if i := strings.IndexByte(text, '\t'); i >= 0 && strings.TrimLeft(text[:i], " ") == "" {
				pos.Col = utf8.RuneCountInString(text[:i]) + 1
			}
		}
	}
	lineAt := func(line int) (string, bool) { return SourceLine(d.file, line) }
	msg += syntaxHint(msg, pos.Line, pos.Col, lineAt)
	d.errs = append(d.errs, &Error{Pos: pos, Msg: "invalid YAML: " + msg})
}

// syntaxHint returns advice to append to the message of a syntax error at
// line:col; lineAt returns the lines of the file.
func syntaxHint(msg string, line, col int, lineAt func(int) (string, bool)) string {
	text, _ := lineAt(line)
	runes := []rune(text)
	if col < 1 || col > len(runes) {
		return ""
	}
	switch {
	case runes[col-1] == '\t' && !strings.Contains(msg, "tab") && strings.TrimLeft(string(runes[:col-1]), " ") == "":
		return " (tabs are not allowed for indentation)"
	case strings.HasPrefix(msg, "mapping values are not allowed"):
		if continuesValue(line, col, lineAt) {
			return " (this line is indented more than the key above it, so it continues that key's value; indent sibling keys alike)"
		}
		return " (quote values that contain \": \", such as a ? b : c expressions)"
	}
	return ""
}

// continuesValue reports whether the ':' at line:col ends the first word of
// its line, and the line is indented more than the key line above it, whose
// value is on that key's line: then the word continues that value as a
// multi-line plain scalar where a sibling key was meant.
func continuesValue(line, col int, lineAt func(int) (string, bool)) bool {
	text, _ := lineAt(line)
	runes := []rune(text)
	key := strings.TrimLeft(string(runes[:col-1]), " ")
	if key == "" || strings.ContainsAny(key, " \t:#'\"[]{},") {
		return false
	}
	indent := col - 1 - utf8.RuneCountInString(key)
	for l := line - 1; l >= 1; l-- {
		prev, ok := lineAt(l)
		if !ok {
			return false
		}
		trimmed := strings.TrimLeft(prev, " ")
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		k, v, found := strings.Cut(trimmed, ": ")
		return found && len(prev)-len(trimmed) < indent && !strings.ContainsAny(k, " \t") && strings.TrimSpace(v) != ""
	}
	return false
}

// Closing brackets appended to a prefix of a document to tell an error that
// the prefix shows only because it ends inside a flow collection from an
// error at a token of the prefix.
var flowClosers = map[string]string{
	"did not find expected ',' or '}'": " }}}}}}}}",
	"did not find expected ',' or ']'": " ]]]]]]]]",
}

// syntaxPos returns the line and column (1-based, in runes) of the token a
// syntax error with message msg of the YAML library is about. The library
// names only a line, often that of the construct the token is in, so
// syntaxPos looks for the shortest prefix of data that parse (which returns
// the error the whole of data gives, or nil) fails on with the same message:
// first by whole lines, starting at near, the line the library names (0 if
// none), then by runes of the line found. The token is the one that ends
// that prefix; syntaxPos returns its first rune.
//
// A prefix that ends inside a flow collection fails with the message of an
// unclosed collection, "did not find expected ',' or ']'", whatever follows
// in data. For those messages a prefix counts only if it fails as well with
// closing brackets appended. When data itself parses once closed, a
// collection is never closed: syntaxPos then returns the opening bracket of
// the outermost one open at the end, which follows the last prefix that does
// not end inside a flow collection.
//
// syntaxPos reports false when it cannot locate the error: data does not
// fail with msg, or is UTF-16. It parses O(log n) prefixes of data, n its
// length.
func syntaxPos(data []byte, msg string, near int, parse func([]byte) error) (line, col int, ok bool) {
	if len(data) == 0 || bytes.HasPrefix(data, []byte{0xfe, 0xff}) || bytes.HasPrefix(data, []byte{0xff, 0xfe}) {
		return 0, 0, false // nothing to search, or UTF-16, whose bytes are not runes
	}
	// message returns the message data[:n] + suffix fails with, "" when it
	// parses.
	message := func(p []byte, suffix string) string {
		if suffix != "" {
			p = append(p[:len(p):len(p)], suffix...)
		}
		err := parse(p)
		if err == nil {
			return ""
		}
		if m := yamlErrorRE.FindStringSubmatch(err.Error()); m != nil {
			return m[2]
		}
		return err.Error()
	}
	if message(data, "") != msg {
		return 0, 0, false
	}
	closer := flowClosers[msg]
	unclosed := closer != "" && message(data, closer) != msg
	fails := func(p []byte) bool {
		switch m := message(p, ""); {
		case unclosed:
			// Inside a flow collection: after an entry, after one of
			// "{[:,", or inside a quoted scalar.
			return m == msg || m == "did not find expected node content" || m == "found unexpected end of stream"
		case m != msg:
			return false
		default:
			return closer == "" || message(p, closer) == msg
		}
	}

	// ends[k] is the length of the prefix holding lines 1..k.
	ends := []int{0}
	for i, b := range data {
		if b == '\n' {
			ends = append(ends, i+1)
		}
	}
	if ends[len(ends)-1] < len(data) {
		ends = append(ends, len(data))
	}
	// Find the first k whose prefix of k lines fails, as the whole of data
	// does. The token is seldom far after the line the library names, so
	// the search starts there. An unclosed collection starts after the last
	// prefix that parses, so that search starts at the end.
	last := len(ends) - 1
	start := min(max(near, 1), last)
	if unclosed {
		start = last
	}
	line = gallop(1, last, start, func(k int) bool { return k == last || fails(data[:ends[k]]) })
	first := ends[line-1]
	text := bytes.TrimSuffix(data[first:ends[line]], []byte("\n"))
	// Then the first rune of the line whose prefix fails: cuts[i] is the
	// length of the line's prefix of i+1 runes, and the whole line with
	// its line break fails.
	var cuts []int
	for i := 0; i < len(text); {
		_, size := utf8.DecodeRune(text[i:])
		i += size
		cuts = append(cuts, i)
	}
	failsCut := func(i int) bool { return i == len(cuts) || fails(data[:first+cuts[i]]) }
	var i int
	if unclosed {
		i = gallop(0, len(cuts), len(cuts), failsCut)
	} else {
		i = bisect(0, len(cuts), failsCut)
	}
	return line, tokenStart([]rune(string(text)), i+1, msg), true
}

// bisect returns the smallest i in [lo, hi] with f(i), for f false up to
// some point and true from there on, f(hi) true. When f is not monotonic, it
// returns an i with f(i) and, unless i is lo, not f(i-1).
func bisect(lo, hi int, f func(int) bool) int {
	for lo < hi {
		if mid := lo + (hi-lo)/2; f(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// gallop is bisect searching from start: it moves away from start, down
// when f(start) holds and up otherwise, with steps that double until f
// changes, then bisects the last step. It evaluates f O(log d) times, d the
// distance from start to the result.
func gallop(lo, hi, start int, f func(int) bool) int {
	if f(start) {
		hi = start
		for step := 1; hi > lo; step *= 2 {
			i := max(hi-step, lo)
			if !f(i) {
				lo = i + 1
				break
			}
			hi = i
		}
	} else {
		for step := 1; ; step *= 2 {
			i := min(start+step, hi)
			if f(i) {
				lo, hi = start+1, i
				break
			}
			start = i
		}
	}
	return bisect(lo, hi, f)
}

// tokenStart returns the column of the first rune of the token whose last
// rune is at column col of the line runes: the opening quote of a quoted
// scalar, the '*' of an alias. Other tokens an error is found at are
// recognised by their first rune.
func tokenStart(runes []rune, col int, msg string) int {
	if col < 1 || col > len(runes) {
		return col
	}
	switch q := runes[col-1]; {
	case strings.HasPrefix(msg, "unknown anchor"):
		for c := col - 1; c >= 0 && runes[c] != ' ' && runes[c] != '\t'; c-- {
			if runes[c] == '*' {
				return c + 1
			}
		}
	case (q == '"' || q == '\'') && msg != "found unexpected end of stream":
		// A closing quote: find the opening one, skipping escaped quotes
		// (\" in double quotes, '' in single quotes).
		for c := col - 2; c >= 0; c-- {
			if runes[c] != q {
				continue
			}
			if q == '"' {
				n := 0
				for c-1-n >= 0 && runes[c-1-n] == '\\' {
					n++
				}
				if n%2 == 0 {
					return c + 1
				}
			} else if c > 0 && runes[c-1] == '\'' {
				c--
			} else {
				return c + 1
			}
		}
	}
	return col
}
