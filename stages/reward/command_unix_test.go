//go:build unix

package reward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestCommandKillsProcessGroup checks that a timeout kills the children of
// the scorer too: the helper starts a grandchild that holds stdout open.
// Were only the helper killed, Score would wait out waitDelay for stdout to
// close, and the grandchild would live on.
func TestCommandKillsProcessGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	c := newCommand(t, helperCommand("group", pidFile), 1)
	c.waitDelay = 20 * time.Second
	start := time.Now()
	_, err := c.Score(context.Background(), testSamples(1))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want a timeout", err)
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("Score took %v: the grandchild kept stdout open", elapsed)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the helper did not start its grandchild: %v", err)
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("grandchild %d still alive after the timeout", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNewCommandNotExecutable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "score.sh")
	if err := os.WriteFile(path, []byte("echo 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{Command: []string{path, "--fast"}})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "command" {
		t.Fatalf("error %v (%T), want a *ConfigError about command", err, err)
	}
	if want := fmt.Sprintf("reward.command: program %q: permission denied", path); err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no procfs: trust kill
	}
	// The state follows the parenthesised command name.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}
