package gpu

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

const mib = 1 << 20

// Presets maps GPU names to their memory in bytes: what a process can
// allocate, CUDA's total (cuDeviceTotalMem, torch's total_memory), which is
// NVML's total less the memory the driver reserves. The H100 and H200
// figures were read on the device machines (torch.cuda.get_device_properties
// in bench/results/*/peer-*.json; on the H100, nvidia-smi -q -d MEMORY
// shows Total 81559 MiB, Reserved 480 MiB). The A100 and L40S figures are
// NVML totals, not measured here: the driver's reserve (about 0.5 GiB on
// the H100) is not subtracted, so a plan within that of the figure may not
// allocate.
var Presets = map[string]int64{
	"h100-80g":  85017493504,  // H100 80GB HBM3: 81079.5 MiB (NVML total 81559 MiB).
	"h200-141g": 150109880320, // H200 141GB.
	"a100-80g":  81920 * mib,  // A100 80GB (NVML total).
	"a100-40g":  40960 * mib,  // A100 40GB (NVML total).
	"l40s-48g":  46068 * mib,  // L40S 48GB (NVML total).
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
	if b, ok, err := parseSize(t, "gpu memory"); ok || err != nil {
		return "custom", b, err
	}
	return "", 0, fmt.Errorf("unknown gpu %q: want a preset (%s), a byte count or a size such as 80GiB",
		s, strings.Join(PresetNames(), ", "))
}

// ParseBytes resolves a memory size: a byte count or a size with a unit,
// as ParseGPU takes them (no presets). what names it in errors.
func ParseBytes(s, what string) (int64, error) {
	b, ok, err := parseSize(strings.TrimSpace(s), what)
	if err == nil && !ok {
		err = fmt.Errorf("%s %q: want a byte count or a size such as 2TiB", what, s)
	}
	return b, err
}

// parseSize reads a byte count or a size with a unit; ok is false when t is
// neither (and err nil), so that the caller can try other forms.
func parseSize(t, what string) (bytes int64, ok bool, err error) {
	if t == "" {
		return 0, false, fmt.Errorf("empty %s", what)
	}
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		if n <= 0 {
			return 0, false, fmt.Errorf("%s %q must be positive", what, t)
		}
		return n, true, nil
	}
	low := strings.ToLower(t)
	for _, u := range units {
		num, found := strings.CutSuffix(low, u.suffix)
		if !found {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			break
		}
		b := v * u.mult
		if b < 1 || b > math.MaxInt64/2 {
			return 0, false, fmt.Errorf("%s %q is out of range", what, t)
		}
		return int64(math.Round(b)), true, nil
	}
	return 0, false, nil
}
