//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package jobs

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// lockRetries and lockRetryWait bound how long lockFile waits for a lock
// held only for an instant, such as by lockFree probing the run from
// another process.
const (
	lockRetries   = 5
	lockRetryWait = 10 * time.Millisecond
)

// flock applies a flock operation to f.
func flock(f *os.File, how int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var lerr error
	if err := rc.Control(func(fd uintptr) {
		lerr = syscall.Flock(int(fd), how)
	}); err != nil {
		return err
	}
	return lerr
}

// lockFile opens path and takes an exclusive, non-blocking flock on it. The
// lock is released by unlockFile or when the process exits, so a crashed
// run never stays locked. A lock that is still held after a few short
// waits gives ErrLocked.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	for try := 0; ; try++ {
		err = flock(f, syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) || try == lockRetries {
			break
		}
		time.Sleep(lockRetryWait)
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("lock: %w", err)
	}
	return f, nil
}

// unlockFile releases a lock taken by lockFile.
func unlockFile(f *os.File) error { return f.Close() }

// lockFree reports whether no process holds the lock at path. It opens
// the file on its own (flock locks belong to an open file description, so
// this conflicts even with a lock held by this process), tries a shared,
// non-blocking flock and closes the file at once, which releases it. A
// shared probe conflicts with the exclusive lock of a live run but not
// with another probe. A missing lock file is free: no process can hold
// it. Any other failure (an unreadable file, a file system without
// flock) answers false, so the caller keeps the stored status.
func lockFree(path string) bool {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	defer f.Close()
	return flock(f, syscall.LOCK_SH|syscall.LOCK_NB) == nil
}
