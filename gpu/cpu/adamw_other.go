//go:build !amd64

package cpu

// hasAVX2 is false off amd64.
var hasAVX2 = false

// adamwVector has no vector kernel off amd64: the step runs in Go.
func adamwVector(p, g, m, v []float32, c *adamwConsts) int { return 0 }

// adamwBF16Vector has no vector kernel off amd64.
func adamwBF16Vector(p, g, m, v []float32, out []uint16, c *adamwConsts) int { return 0 }

// sumSquaresVector has no vector kernel off amd64.
func sumSquaresVector(x []float32) (float64, int) { return 0, 0 }

// bf16Vector has no vector kernel off amd64.
func bf16Vector(dst []uint16, src []float32) int { return 0 }

// addScaledVector has no vector kernel off amd64.
func addScaledVector(dst, x []float32, s float32) int { return 0 }
