//go:build cgo

package libnccl

import (
	"strings"
	"testing"
)

func TestVersionString(t *testing.T) {
	for _, c := range []struct {
		code int
		want string
	}{
		{22803, "2.28.3"}, {21805, "2.18.5"}, {20901, "2.9.1"}, {2804, "2.8.4"}, {2708, "2.7.8"},
	} {
		if got := versionString(c.code); got != c.want {
			t.Errorf("versionString(%d) = %q, want %q", c.code, got, c.want)
		}
	}
}

// Without libnccl in the directories searched, the error says what was
// looked for and where.
func TestLoadMissing(t *testing.T) {
	dir := t.TempDir()
	_, err := load([]string{dir})
	if err == nil {
		t.Fatal("no error from an empty directory")
	}
	for _, s := range []string{"libnccl.so.2", dir, "no candidate file found"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}
