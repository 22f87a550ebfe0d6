// Package engines holds the HTTP clients of the inference engines that
// rlpipe's generate, push_weights, sleep and wake stages drive: SGLang's
// native API and the OpenAI-compatible API that vLLM serves.
//
// A Client samples responses (token ids, the engine's per-token log-probs
// and the finish reason), makes the engine reload weights from a directory,
// frees and restores the engine's GPU memory for a colocated trainer, and
// checks the engine's health. Every request is bounded: at most
// Options.Concurrency generation requests are in flight per client, each
// attempt has a timeout, failed attempts (network errors, timeouts, 429 and
// 5xx answers) are retried with exponential backoff, and the first request
// that fails for good cancels the rest of its call. Every call honours its
// context. Errors are *Error values naming the engine, the operation, the
// method and URL, the HTTP status and the start of the body.
//
// The subpackage enginetest has test servers that speak both protocols.
package engines
