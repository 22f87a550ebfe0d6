//go:build cgo

package cuda

import "github.com/rlpipe/rlpipe/gpu"

// persistentGrid is the grid of a persistent product of tiles tiles (the
// gate/up, dswiglu, q/k/v and log-prob head kernels, which take their
// tiles from the stream's tile queue): one CTA per SM, or one per tile
// where there are fewer.
func (b *Backend) persistentGrid(tiles int) uint32 {
	return uint32(min(tiles, max(b.d.info.SMs, 1)))
}

// persistentStart returns the stream a persistent product launches on and
// the tensor maps of its operands (keys).
func (b *Backend) persistentStart(keys ...tmapKey) (*Stream, [][128]byte, error) {
	s, err := b.stream()
	if err != nil {
		return nil, nil, err
	}
	ms, err := tensorMaps(b.d, keys...)
	if err != nil {
		return nil, nil, err
	}
	return s, ms, nil
}

// kernel16 names base's instance for the 16-bit dtype dt: base_f16 for
// f16, base_bf16 otherwise.
func kernel16(base string, dt gpu.DType) string {
	if dt == gpu.F16 {
		return base + "_f16"
	}
	return base + "_bf16"
}
