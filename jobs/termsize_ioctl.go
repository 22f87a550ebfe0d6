//go:build linux || darwin

package jobs

import (
	"os"
	"syscall"
	"unsafe"
)

// termWidth returns the number of columns of the terminal f, or 0.
func termWidth(f *os.File) int {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	var ws struct{ Row, Col, X, Y uint16 }
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, uintptr(syscall.TIOCGWINSZ), uintptr(unsafe.Pointer(&ws)))
	}); err != nil || errno != 0 {
		return 0
	}
	return int(ws.Col)
}
