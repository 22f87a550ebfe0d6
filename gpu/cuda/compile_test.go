//go:build cgo

package cuda

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestKernelsCompile compiles every embedded kernel module with NVRTC for
// sm_80, sm_90 and sm_90a (no driver or GPU needed, only libnvrtc), or for
// the architectures in RLPIPE_COMPILE_ARCHS (comma-separated), and logs
// each module's compile time: on a machine without the kernel cache, the
// first run waits for the slowest module. It skips when NVRTC cannot be
// loaded, as on machines without the CUDA toolkit.
func TestKernelsCompile(t *testing.T) {
	if err := load(libNVRTC); err != nil {
		t.Skipf("nvrtc not available, kernel compilation not checked: %v", err)
	}
	archs := []string{"sm_80", "sm_90", "sm_90a"}
	if a := os.Getenv("RLPIPE_COMPILE_ARCHS"); a != "" {
		archs = strings.Split(a, ",")
	}
	for _, arch := range archs {
		mods, err := modules()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mods {
			start := time.Now()
			if _, err := compile(m.name, m.src, arch); err != nil {
				t.Errorf("%s for %s: %v", m.name, arch, err)
			}
			t.Logf("%s for %s: %.1f s", m.name, arch, time.Since(start).Seconds())
		}
	}
}
