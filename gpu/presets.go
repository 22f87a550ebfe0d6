package gpu

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

const mib = 1 << 20

// Presets maps GPU names to their memory in bytes: the total that NVML
// reports for the device (nvidia-smi "Total" in MiB × 2^20), which is less
// than the marketing figure because of reserved memory.
var Presets = map[string]int64{
	"h100-80g":  81559 * mib,  // H100 SXM/PCIe 80GB: 85520809984 bytes.
	"h200-141g": 143771 * mib, // H200 141GB.
	"a100-80g":  81920 * mib,  // A100 80GB.
	"a100-40g":  40960 * mib,  // A100 40GB.
	"l40s-48g":  46068 * mib,  // L40S 48GB.
}

// PresetNames returns the preset names in sorted order.
func PresetNames() []string {
	names := make([]string, 0, len(Presets))
	for n := range Presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

var units = []struct {
	suffix string
	mult   float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"b", 1},
}

// ParseGPU resolves a GPU memory description: a preset name (returned as
// name), a byte count ("85520809984"), or a size with a unit ("80GiB",
// "79.5 GiB", "80GB"; KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers
// of 1000, case-insensitive). For sizes the name is "custom".
func ParseGPU(s string) (name string, bytes int64, err error) {
	t := strings.TrimSpace(s)
	if b, ok := Presets[strings.ToLower(t)]; ok {
		return strings.ToLower(t), b, nil
	}
	if t == "" {
		return "", 0, fmt.Errorf("empty gpu memory spec")
	}
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		if n <= 0 {
			return "", 0, fmt.Errorf("gpu memory %q must be positive", s)
		}
		return "custom", n, nil
	}
	low := strings.ToLower(t)
	for _, u := range units {
		num, ok := strings.CutSuffix(low, u.suffix)
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			break
		}
		b := v * u.mult
		if b < 1 || b > math.MaxInt64/2 {
			return "", 0, fmt.Errorf("gpu memory %q is out of range", s)
		}
		return "custom", int64(math.Round(b)), nil
	}
	return "", 0, fmt.Errorf("unknown gpu %q: want a preset (%s), a byte count or a size such as 80GiB",
		s, strings.Join(PresetNames(), ", "))
}
