package nvml

import (
	"reflect"
	"testing"
)

// TestVisible reads CUDA_VISIBLE_DEVICES as CUDA does over a host of four
// GPUs: indices and UUIDs (and unique UUID prefixes) in the order named,
// the list cut at the first entry that names no device or one named
// before, every GPU hidden by an empty value, all shown when unset, and
// MIG instances refused.
func TestVisible(t *testing.T) {
	devs := []Device{{Index: 0, UUID: "GPU-aaaa-0000"}, {Index: 1, UUID: "GPU-abcd-1111"}, {Index: 2, UUID: "GPU-bbbb-2222"}, {Index: 3, UUID: "GPU-cccc-3333"}}
	tests := []struct {
		name  string
		value string
		set   bool
		want  []int // NVML indices, in CUDA's order
		err   bool
	}{
		{"unset: every GPU", "", false, []int{0, 1, 2, 3}, false},
		{"empty: none", "", true, nil, false},
		{"one index (Slurm's task GPU)", "3", true, []int{3}, false},
		{"indices in the order named", "2,0", true, []int{2, 0}, false},
		{"spaces ignored", " 1 , 2 ", true, []int{1, 2}, false},
		{"UUIDs", "GPU-cccc-3333,GPU-aaaa-0000", true, []int{3, 0}, false},
		{"a unique UUID prefix", "GPU-bb", true, []int{2}, false},
		{"an ambiguous prefix ends the list", "3,GPU-a,1", true, []int{3}, false},
		{"an unknown index ends the list", "1,7,2", true, []int{1}, false},
		{"a negative index ends it", "-1,2", true, nil, false},
		{"a repeat ends it", "0,0,1", true, []int{0}, false},
		{"MIG is refused", "MIG-1234", true, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Visible(devs, tt.value, tt.set)
			if (err != nil) != tt.err {
				t.Fatalf("err = %v, want error %v", err, tt.err)
			}
			var idx []int
			for _, d := range got {
				idx = append(idx, d.Index)
			}
			if !reflect.DeepEqual(idx, tt.want) {
				t.Errorf("NVML indices %v, want %v", idx, tt.want)
			}
		})
	}
}
