//go:build cgo

package cuda

import (
	"reflect"
	"strings"
	"testing"
)

// TestSplitParts checks splitParts on small sources: one module without a
// "parts" line; with one, each kernel in exactly one part (every N-th),
// the others' definitions blanked to as many empty lines, bodies with
// nested braces taken whole; and errors for a bad count.
func TestSplitParts(t *testing.T) {
	const kernels = `// a file
extern "C" __global__ void k_a(int* x) { x[0] = 1; }
template <int N> __device__ void helper(int* x) { if (N) { x[0] = N; } }
extern "C" __global__ void __launch_bounds__(128) k_b(int* x,
    int n) {
  for (int i = 0; i < n; i++) { helper<2>(x); }
}
extern "C" __global__ void k_c(int* x) { helper<3>(x); }
`
	for _, c := range []struct {
		name, src string
		want      map[string][]string // module name → kernels
		err       string
	}{
		{"one.cu", kernels, map[string][]string{"one": {"k_a", "k_b", "k_c"}}, ""},
		{"two.cu", "// parts: 2\n" + kernels, map[string][]string{"two.0": {"k_a", "k_c"}, "two.1": {"k_b"}}, ""},
		{"three.cu", "// parts: 3\n" + kernels, map[string][]string{"three.0": {"k_a"}, "three.1": {"k_b"}, "three.2": {"k_c"}}, ""},
		{"four.cu", "// parts: 4\n" + kernels, nil, "parts: 4 for 3 kernels"},
		{"zero.cu", "// parts: 0\n" + kernels, nil, "parts: 0 for 3 kernels"},
		{"open.cu", "// parts: 2\n" + kernels + "extern \"C\" __global__ void k_d(int* x) { {\n", nil, "k_d's body is not closed"},
	} {
		mods, err := splitParts(c.name, c.src)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one containing %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := map[string][]string{}
		for _, m := range mods {
			got[m.name] = m.funcs
			if strings.Count(m.src, "\n") != strings.Count(c.src, "\n") {
				t.Errorf("%s: %d lines, want %d", m.name, strings.Count(m.src, "\n"), strings.Count(c.src, "\n"))
			}
			if n := strings.Count(m.src, "__global__"); n != len(m.funcs) {
				t.Errorf("%s: %d kernels left in the source, want %d:\n%s", m.name, n, len(m.funcs), m.src)
			}
			for _, f := range m.funcs {
				if !strings.Contains(m.src, " "+f+"(") {
					t.Errorf("%s: kernel %s missing from its source", m.name, f)
				}
			}
			if !strings.Contains(m.src, "helper(int* x)") {
				t.Errorf("%s: lost the shared template", m.name)
			}
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: modules %v, want %v", c.name, got, c.want)
		}
	}
	// The embedded attention.cu is split into 8 modules, every kernel of
	// the file in exactly one of them.
	mods, err := modules()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := kernelFS.ReadFile("kernels/attention.cu")
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, x := range kernelRE.FindAllStringSubmatch(string(raw), -1) {
		count[x[1]] = 0
	}
	parts := 0
	for _, m := range mods {
		if !strings.HasPrefix(m.name, "attention.") {
			continue
		}
		parts++
		for _, f := range m.funcs {
			if _, ok := count[f]; !ok {
				t.Errorf("%s: kernel %s is not in attention.cu", m.name, f)
			}
			count[f]++
		}
	}
	if parts != 8 {
		t.Errorf("attention.cu compiled as %d modules, want 8", parts)
	}
	if len(count) == 0 {
		t.Fatal("attention.cu: no kernels found")
	}
	for f, n := range count {
		if n != 1 {
			t.Errorf("attention.cu kernel %s is in %d modules, want 1", f, n)
		}
	}
}
