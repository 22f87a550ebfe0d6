package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// dtypeKeys are the keys config.json names the weights' dtype under: the
// transformers 4 spelling and the transformers 5 one.
var dtypeKeys = []string{"torch_dtype", "dtype"}

// MarshalExport renders the config as the config.json of an export of the
// checkpoint it was read from: the source config.json (Raw) as it was, byte
// for byte, in its own dialect, with unknown keys and key order kept, and
// only the dtype changed to DType. The dtype is written under the key the
// source used (torch_dtype, dtype, or both where the source had both);
// a source that named no dtype (float32, as transformers assumes) gets one
// only when DType is not float32, under dtype for a transformers 5 config
// (rope_parameters, or transformers_version 5 or later) and torch_dtype
// otherwise. A config with no Raw (built in code), or whose Raw no longer
// describes it (a field other than DType was changed after parsing), is
// rendered by MarshalHF instead.
func (c *Config) MarshalExport() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(c.Raw)) == 0 {
		return c.MarshalHF()
	}
	src, err := ParseConfig(c.Source, c.Raw)
	if err != nil {
		return nil, fmt.Errorf("source config: %w", err)
	}
	if !sameArchitecture(src, c) {
		return c.MarshalHF()
	}
	if src.DType == c.DType {
		return bytes.Clone(c.Raw), nil
	}
	obj, err := scanObject(c.Raw)
	if err != nil {
		return nil, fmt.Errorf("source config: %w", err)
	}
	value := jsonString(c.DType)
	var keys []string
	for _, k := range dtypeKeys {
		if _, ok := obj.member(k); ok {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		key := "torch_dtype"
		if transformers5(src.Raw) {
			key = "dtype"
		}
		return obj.insert(key, value), nil
	}
	return obj.replace(keys, value), nil
}

// sameArchitecture reports whether a and b describe the same model: every
// field but Source, Raw and DType equal.
func sameArchitecture(a, b *Config) bool {
	x, y := *a, *b
	x.Source, x.Raw, x.DType = "", nil, ""
	y.Source, y.Raw, y.DType = "", nil, ""
	return reflect.DeepEqual(x, y)
}

// transformers5 reports whether the config.json data is in the
// transformers 5 dialect: it has rope_parameters, or transformers_version
// says 5 or later.
func transformers5(data []byte) bool {
	var m struct {
		Rope    json.RawMessage `json:"rope_parameters"`
		Version string          `json:"transformers_version"`
	}
	if json.Unmarshal(data, &m) != nil {
		return false
	}
	if len(m.Rope) > 0 && string(m.Rope) != "null" {
		return true
	}
	major, _, _ := strings.Cut(m.Version, ".")
	n, err := strconv.Atoi(major)
	return err == nil && n >= 5
}

// rawObject is a JSON object's text with the byte spans of its top-level
// members, so that a member's value can be changed while every other byte
// stays as written.
type rawObject struct {
	data    []byte
	members []rawMember
	indent  []byte // the whitespace before the first key
	lastEnd int    // the end of the last member's value
}

// rawMember is one top-level member of a rawObject: its key and where its
// value's text is.
type rawMember struct {
	key        string
	start, end int
}

// scanObject finds the top-level members of the JSON object data.
func scanObject(data []byte) (*rawObject, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("want a JSON object")
	}
	o := &rawObject{data: data}
	open := int(dec.InputOffset())
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		afterKey := int(dec.InputOffset())
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		end := int(dec.InputOffset())
		// Between the key and the end: blanks, the colon, blanks, the value
		// (and perhaps blanks the decoder read past).
		span := data[afterKey:end]
		colon := bytes.IndexByte(span, ':')
		if colon < 0 {
			return nil, fmt.Errorf("no colon after key %q", key)
		}
		rest := span[colon+1:]
		start := afterKey + colon + 1 + (len(rest) - len(bytes.TrimLeft(rest, " \t\r\n")))
		end = afterKey + len(bytes.TrimRight(span, " \t\r\n"))
		if len(o.members) == 0 {
			gap := data[open:afterKey]
			o.indent = gap[:len(gap)-len(bytes.TrimLeft(gap, " \t\r\n"))]
		}
		o.members = append(o.members, rawMember{key: key, start: start, end: end})
		o.lastEnd = end
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if len(o.members) == 0 {
		return nil, errors.New("empty JSON object")
	}
	return o, nil
}

// member returns the top-level member called key.
func (o *rawObject) member(key string) (rawMember, bool) {
	for _, m := range o.members {
		if m.key == key {
			return m, true
		}
	}
	return rawMember{}, false
}

// replace returns the object's text with the value of each of keys (all
// present) set to value.
func (o *rawObject) replace(keys []string, value []byte) []byte {
	var out []byte
	at := 0
	for _, m := range o.members {
		for _, k := range keys {
			if m.key == k {
				out = append(out, o.data[at:m.start]...)
				out = append(out, value...)
				at = m.end
			}
		}
	}
	return append(out, o.data[at:]...)
}

// insert returns the object's text with member key: value added after the
// last member, indented as the first one is.
func (o *rawObject) insert(key string, value []byte) []byte {
	sep := ": "
	if len(o.indent) == 0 {
		sep = ":"
	}
	out := append([]byte(nil), o.data[:o.lastEnd]...)
	out = append(out, ',')
	out = append(out, o.indent...)
	out = append(out, jsonString(key)...)
	out = append(out, sep...)
	out = append(out, value...)
	return append(out, o.data[o.lastEnd:]...)
}

// jsonString is s as a JSON string.
func jsonString(s string) []byte {
	b, _ := json.Marshal(s) // a string always encodes
	return b
}
