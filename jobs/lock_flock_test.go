//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package jobs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFlockPerOpenFileDescription checks the premise of the tests below:
// flock locks belong to an open file description, so a second open and
// flock of the same file in the same process conflicts with the first,
// and closing the first (as the kernel does for a dead process) frees it.
func TestFlockPerOpenFileDescription(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	a, err := lockFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockFile(path); !errors.Is(err, ErrLocked) {
		t.Fatalf("second lock in the same process: %v, want ErrLocked", err)
	}
	if lockFree(path) {
		t.Fatal("lockFree while another description holds the lock")
	}
	a.Close()
	if !lockFree(path) {
		t.Fatal("lock not free after its file was closed")
	}
	// The probe releases what it took.
	b, err := lockFile(path)
	if err != nil {
		t.Fatalf("lock after probe: %v", err)
	}
	b.Close()
	if !lockFree(filepath.Join(t.TempDir(), "missing")) {
		t.Error("a missing lock file is not free")
	}
}

// TestLockFileWaitsForProbe checks that a lock held only for an instant,
// as by another process's probe, does not make lockFile fail.
func TestLockFileWaitsForProbe(t *testing.T) {
	tests := []struct {
		name    string
		hold    time.Duration // how long another description holds the lock; <0: throughout
		wantErr error
	}{
		{"free", 0, nil},
		{"brief", time.Millisecond, nil},
		{"held", -1, ErrLocked},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "lock")
			if tt.hold != 0 {
				other, err := lockFile(path)
				if err != nil {
					t.Fatal(err)
				}
				defer other.Close()
				if tt.hold > 0 {
					time.AfterFunc(tt.hold, func() { other.Close() })
				}
			}
			f, err := lockFile(path)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if f != nil {
				f.Close()
			}
		})
	}
}

// statusOf returns the status of the run id as List and Open report it
// and as run.json stores it.
func statusOf(t *testing.T, root, id string) (listed, opened, stored Status) {
	t.Helper()
	ms, err := List(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.ID == id {
			listed = m.Status
		}
	}
	o, err := Open(root, id)
	if err != nil {
		t.Fatal(err)
	}
	m, err := readMeta(o.Dir())
	if err != nil {
		t.Fatal(err)
	}
	return listed, o.Meta().Status, m.Status
}

func TestInterrupted(t *testing.T) {
	tests := []struct {
		name   string
		after  func(t *testing.T, r *Run) // r still holds its lock
		want   Status
		stored Status
	}{
		{"live", func(t *testing.T, r *Run) {}, StatusRunning, StatusRunning},
		{"killed", func(t *testing.T, r *Run) {
			r.Close() // what the kernel does for a process that dies
		}, StatusInterrupted, StatusRunning},
		{"held by another description", func(t *testing.T, r *Run) {
			r.Close()
			f, err := lockFile(filepath.Join(r.Dir(), lockFileName))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
		}, StatusRunning, StatusRunning},
		{"lock file gone", func(t *testing.T, r *Run) {
			r.Close()
			if err := os.Remove(filepath.Join(r.Dir(), lockFileName)); err != nil {
				t.Fatal(err)
			}
		}, StatusInterrupted, StatusRunning},
		{"failed then closed", func(t *testing.T, r *Run) {
			if err := r.SetStatus(StatusFailed, errors.New("boom")); err != nil {
				t.Fatal(err)
			}
			r.Close()
		}, StatusFailed, StatusFailed},
		{"stopped then closed", func(t *testing.T, r *Run) {
			if err := r.SetStatus(StatusStopped, nil); err != nil {
				t.Fatal(err)
			}
			r.Close()
		}, StatusStopped, StatusStopped},
		{"killed, then resumed by another Run", func(t *testing.T, r *Run) {
			r.Close()
			o, err := Open(filepath.Dir(r.Dir()), r.ID())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { o.Close() })
			if _, _, _, err := o.Resume(); err != nil {
				t.Fatal(err)
			}
		}, StatusRunning, StatusRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			r := mustCreate(t, root, t0, "12345678-0000-4000-8000-000000000001", Meta{TotalSteps: 3})
			tt.after(t, r)
			listed, opened, stored := statusOf(t, root, r.ID())
			if listed != tt.want || opened != tt.want || stored != tt.stored {
				t.Errorf("listed %s, opened %s, stored %s; want %s, %s, stored %s",
					listed, opened, stored, tt.want, tt.want, tt.stored)
			}
		})
	}
}

func TestResumeInterrupted(t *testing.T) {
	root := t.TempDir()
	r := mustCreate(t, root, t0, "12345678-0000-4000-8000-000000000001", Meta{TotalSteps: 3})
	if err := r.AppendMetrics(Metrics{Step: 1}); err != nil {
		t.Fatal(err)
	}
	r.Close()
	o, err := Open(root, r.ID())
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if s := o.Meta().Status; s != StatusInterrupted {
		t.Fatalf("status = %s, want interrupted", s)
	}
	// A setter on the opened run stores what it reports.
	if err := o.SetTotalSteps(4); err != nil {
		t.Fatal(err)
	}
	if m, err := readMeta(o.Dir()); err != nil || m.Status != StatusInterrupted {
		t.Fatalf("stored %+v, %v; want interrupted", m, err)
	}
	if _, _, ok, err := o.Resume(); err != nil || ok {
		t.Fatalf("resume = %v, %v", ok, err)
	}
	m := o.Meta()
	if m.Status != StatusRunning || m.Resumes != 1 || m.LastStep != 0 {
		t.Errorf("meta after resume = %+v", m)
	}
	if _, opened, stored := statusOf(t, root, r.ID()); opened != StatusRunning || stored != StatusRunning {
		t.Errorf("after resume: opened %s, stored %s", opened, stored)
	}
}

// TestHelperProcess is not a test: TestKilledProcess runs the test binary
// with JOBS_HELPER_ROOT set, and this creates a run there, prints its id
// and waits to be killed.
func TestHelperProcess(t *testing.T) {
	root := os.Getenv("JOBS_HELPER_ROOT")
	if root == "" {
		t.Skip("helper process for TestKilledProcess")
	}
	r, err := Create(root, Meta{TotalSteps: 5})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(r.ID())
	time.Sleep(time.Minute) // TestKilledProcess kills it long before
	os.Exit(2)
}

// TestKilledProcess runs a real process that creates a run, and SIGKILLs
// it: the run shows as running while the process lives and as
// interrupted afterwards, though run.json still says running.
func TestKilledProcess(t *testing.T) {
	root := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), "JOBS_HELPER_ROOT="+root)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	id := strings.TrimSpace(line)
	if err != nil || strings.HasPrefix(id, "error") {
		t.Fatalf("helper: %q, %v", line, err)
	}
	if listed, opened, _ := statusOf(t, root, id); listed != StatusRunning || opened != StatusRunning {
		t.Fatalf("live process: listed %s, opened %s", listed, opened)
	}
	o, err := Open(root, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := o.Resume(); !errors.Is(err, ErrLocked) {
		t.Fatalf("resume of a live run: %v, want ErrLocked", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	listed, opened, stored := statusOf(t, root, id)
	if listed != StatusInterrupted || opened != StatusInterrupted || stored != StatusRunning {
		t.Fatalf("killed process: listed %s, opened %s, stored %s", listed, opened, stored)
	}
}
