package launch

import (
	"fmt"
	"strconv"
	"strings"
)

// ExpandHostList expands a Slurm host list, "gpu-[01-03,07],login1" →
// gpu-01 gpu-02 gpu-03 gpu-07 login1, keeping the zero padding of the
// ranges and taking several bracket groups of one name as their product.
func ExpandHostList(list string) ([]string, error) {
	var out []string
	depth, start := 0, 0
	for i := 0; i <= len(list); i++ {
		if i < len(list) {
			switch list[i] {
			case '[':
				depth++
				continue
			case ']':
				depth--
				if depth < 0 {
					return nil, fmt.Errorf("unbalanced ] at %d", i)
				}
				continue
			case ',':
				if depth > 0 {
					continue
				}
			default:
				continue
			}
		}
		if depth != 0 {
			return nil, fmt.Errorf("unbalanced [")
		}
		if item := strings.TrimSpace(list[start:i]); item != "" {
			hosts, err := expandHost(item)
			if err != nil {
				return nil, err
			}
			out = append(out, hosts...)
		}
		start = i + 1
	}
	return out, nil
}

// expandHost expands one name with bracket groups.
func expandHost(s string) ([]string, error) {
	open := strings.IndexByte(s, '[')
	if open < 0 {
		return []string{s}, nil
	}
	end := strings.IndexByte(s[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("unbalanced [ in %q", s)
	}
	end += open
	rest, err := expandHost(s[end+1:])
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range strings.Split(s[open+1:end], ",") {
		lo, hi, ok := strings.Cut(r, "-")
		if !ok {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a > b || b-a > 1<<16 {
			return nil, fmt.Errorf("bad range %q in %q", r, s)
		}
		for v := a; v <= b; v++ {
			num := fmt.Sprintf("%0*d", len(lo), v)
			for _, t := range rest {
				out = append(out, s[:open]+num+t)
			}
		}
	}
	return out, nil
}
