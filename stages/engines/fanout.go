package engines

import (
	"context"
	"sync"
	"sync/atomic"
)

// fanOut calls do(ctx, k) for every k in [0, n) on at most workers
// goroutines. The first error cancels the context the other calls got and
// is returned once every goroutine has ended. Where ctx ends before every
// call was made, it returns ctx's error.
func fanOut(ctx context.Context, n, workers int, do func(ctx context.Context, k int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next  atomic.Int64
		done  atomic.Int64
		once  sync.Once
		first error
		wg    sync.WaitGroup
	)
	for range min(workers, n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				k := int(next.Add(1) - 1)
				if k >= n {
					return
				}
				if err := do(ctx, k); err != nil {
					once.Do(func() {
						first = err
						cancel()
					})
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	if int(done.Load()) < n {
		return ctx.Err()
	}
	return nil
}
