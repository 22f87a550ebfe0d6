//go:build cgo

package cuda

import (
	"fmt"
	"time"
)

// Delay holds the backend's stream for about d: one thread spins on the
// GPU's global timer, so that later work on the stream starts no sooner.
// Tests of stream ordering use it to make a stream run late: work on other
// streams that does not wait for it then runs first.
func (b *Backend) Delay(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("cuda: delay %v is negative", d)
	}
	return b.issue(launch{name: "k_spin", gx: 1, gy: 1, gz: 1, bx: 1, by: 1, bz: 1, args: new(kargs).u64(uint64(d.Nanoseconds()))})
}
