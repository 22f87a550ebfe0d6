package engines

import (
	"net/http"
	"time"
)

// requesterOf returns the requester of a client of this package.
func requesterOf(c Client) *requester {
	switch c := c.(type) {
	case *sglang:
		return c.r
	case *openAI:
		return c.r
	}
	panic("not a client of package engines")
}

// SetBackoff sets the first and the longest wait between attempts of c.
func SetBackoff(c Client, first, longest time.Duration) {
	r := requesterOf(c)
	r.backoff, r.maxBackoff = first, longest
}

// Delay returns c's wait after failed attempt number attempt, the server
// having asked for after.
func Delay(c Client, attempt int, after time.Duration) time.Duration {
	return requesterOf(c).delay(attempt, after)
}

// Settings returns c's concurrency, timeout, retries and base URL.
func Settings(c Client) (conc int, timeout time.Duration, retries int, base string) {
	r := requesterOf(c)
	return r.conc, r.timeout, r.retries, r.base
}

// HTTPClient returns the HTTP client c sends with.
func HTTPClient(c Client) *http.Client { return requesterOf(c).client }

// RetryAfter exposes retryAfter.
var RetryAfter = retryAfter
