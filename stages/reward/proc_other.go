//go:build !unix

package reward

import "os/exec"

// ownProcessGroup is a no-op where process groups are not available: the
// cancellation of the context kills the program itself (os/exec's default).
func ownProcessGroup(cmd *exec.Cmd) {}
