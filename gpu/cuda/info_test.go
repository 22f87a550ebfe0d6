//go:build cgo

package cuda

import (
	"strings"
	"testing"
)

// TestInfoString checks the doctor report's lines (no GPU needed): the
// versions, each device, and the hint for a driver without tensor maps,
// which the Hopper attention kernels need.
func TestInfoString(t *testing.T) {
	base := Info{DriverVersion: 13000, NVRTCMajor: 13, CublasLtVersion: 130100, KernelCacheDir: "/c",
		Devices: []DeviceInfo{{Index: 0, Name: "NVIDIA H100", CCMajor: 9, SMs: 132, MemoryBytes: 80 << 30}}}
	for _, c := range []struct {
		tmaps     bool
		want, not []string
	}{
		{true, []string{"driver 13.0, nvrtc 13.0, cublasLt 130100", "device 0: NVIDIA H100, compute capability 9.0, 132 SMs, 80.0 GiB", "kernel cache: /c"},
			[]string{"tensor maps"}},
		{false, []string{"tensor maps: not in this driver (on Hopper set RLPIPE_CUDA_FWD_WS=0 RLPIPE_CUDA_BWD_TMA=0)"}, nil},
	} {
		i := base
		i.TensorMaps = c.tmaps
		s := i.String()
		for _, w := range c.want {
			if !strings.Contains(s, w) {
				t.Errorf("TensorMaps %v: report lacks %q:\n%s", c.tmaps, w, s)
			}
		}
		for _, w := range c.not {
			if strings.Contains(s, w) {
				t.Errorf("TensorMaps %v: report has %q:\n%s", c.tmaps, w, s)
			}
		}
	}
}
