//go:build cgo

package cuda

import (
	"testing"
)

// TestKernelsCompile compiles every embedded kernel module with NVRTC for
// sm_80, sm_90 and sm_90a (no driver or GPU needed, only libnvrtc). It skips when
// NVRTC cannot be loaded, as on machines without the CUDA toolkit.
func TestKernelsCompile(t *testing.T) {
	if err := load(libNVRTC); err != nil {
		t.Skipf("nvrtc not available, kernel compilation not checked: %v", err)
	}
	for _, arch := range []string{"sm_80", "sm_90", "sm_90a"} {
		mods, err := modules()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mods {
			if _, err := compile(m.name, m.src, arch); err != nil {
				t.Errorf("%s for %s: %v", m.name, arch, err)
			}
		}
	}
}
