//go:build !(linux || darwin)

package jobs

import "os"

// termWidth returns 0: the width is not known on this platform.
func termWidth(*os.File) int { return 0 }
