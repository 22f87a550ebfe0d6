// Package jobs keeps the on-disk record of rlpipe runs: one directory per
// run, the spec it was started from, the resolved spec and memory plan,
// per-step metrics, a log, and committed checkpoints that a later
// `rlpipe run --resume` continues from.
//
// A run directory lives under a root (DefaultRoot unless overridden) and is
// named "<YYYYMMDD-HHMMSS>-<first 8 hex digits of the run uuid>", the time
// being the creation time in UTC. It holds:
//
//	run.json           Meta: id, name, status, steps, host, version, times
//	spec.yaml          the original spec bytes
//	resolved.json      the resolved spec
//	plan.json          the memory plan
//	metrics.jsonl      one JSON object per step (see Metrics)
//	log                free-form log the caller attaches a writer to
//	checkpoints/step-N a checkpoint; complete only once it holds the
//	                   marker file written by CommitCheckpoint
//
// Every file other than metrics.jsonl and log is replaced atomically
// (temporary file, fsync, rename, fsync of the directory), so a crash leaves
// either the old or the new contents, never a mix. Metric lines are
// appended and fsynced one at a time; a line cut short by a crash is
// detected and ignored by readers and removed before the next append.
//
// Steps are numbered from 1. Meta.LastStep is 0 while no step has
// completed, and a checkpoint at step 0 may hold the initial weights.
package jobs
