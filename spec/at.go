package spec

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// At returns the position of the value at path, a dotted path of keys as
// error messages write them: "models.actor.path", "data.rollouts",
// "mesh.gpu", "train.betas[1]", "stages.step[0].with.model". The empty path
// is the whole document.
//
// For a scalar value the position is that of the value itself (of the alias,
// when the value is written as one); for a mapping, a list or a null value it
// is that of its key, and for a list item that of the item. When nothing is
// written at path, At falls back to the nearest enclosing key or list item
// that is written, and to the start of the document: At("train.decay_steps")
// of a spec without that key is the position of the `train:` key. At returns
// Pos{File: s.File} for a spec that was not parsed.
func (s *Spec) At(path string) Pos {
	for p := path; ; p = parentPath(p) {
		if pos, ok := s.positions[p]; ok {
			return pos
		}
		if p == "" {
			return Pos{File: s.File}
		}
	}
}

// parentPath returns the path of the key or list item enclosing path, ""
// for a top-level key. Model names may contain dots: the parent of
// "models.qwen2.5" is "models", that of "models.qwen2.5.path" is
// "models.qwen2.5".
func parentPath(path string) string {
	if strings.HasSuffix(path, "]") {
		if i := strings.LastIndexByte(path, '['); i >= 0 {
			return path[:i]
		}
	}
	if rest, ok := strings.CutPrefix(path, "models."); ok {
		for _, k := range modelKeys {
			if name, ok := strings.CutSuffix(rest, "."+k); ok && name != "" {
				return "models." + name
			}
		}
		return "models"
	}
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		return path[:i]
	}
	return ""
}

// positions records the position of every key of the document root under its
// dotted path, as Spec.At describes, with "" for the root.
func (d *decoder) positions(root *yaml.Node) map[string]Pos {
	m := map[string]Pos{"": d.pos(root)}
	d.walkPositions(m, root, "", 0)
	return m
}

// walkPositions records the keys and list items under the collection n at
// path. Aliases are not followed: the keys of an aliased mapping are recorded
// only under the path where its anchor is defined.
func (d *decoder) walkPositions(m map[string]Pos, n *yaml.Node, path string, depth int) {
	if depth > maxDepth {
		return
	}
	add := func(p string, at, v *yaml.Node) {
		if _, dup := m[p]; dup {
			return
		}
		if r := resolve(v); r != nil && r.Kind == yaml.ScalarNode && !isNull(r) {
			at = v
		}
		m[p] = d.pos(at)
		if v.Kind == yaml.MappingNode || v.Kind == yaml.SequenceNode {
			d.walkPositions(m, v, p, depth+1)
		}
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!merge" {
				continue
			}
			add(join(path, k.Value), k, n.Content[i+1])
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			add(fmt.Sprintf("%s[%d]", path, i), c, c)
		}
	}
}
