//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package jobs

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockFile opens path and takes an exclusive, non-blocking flock on it. The
// lock is released by unlockFile or when the process exits, so a crashed
// run never stays locked.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock: %w", err)
	}
	var lerr error
	if err := rc.Control(func(fd uintptr) {
		lerr = syscall.Flock(int(fd), syscall.LOCK_EX|syscall.LOCK_NB)
	}); err != nil {
		lerr = err
	}
	if lerr != nil {
		f.Close()
		if errors.Is(lerr, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("lock: %w", lerr)
	}
	return f, nil
}

// unlockFile releases a lock taken by lockFile.
func unlockFile(f *os.File) error { return f.Close() }
