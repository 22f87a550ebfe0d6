// Package jobs keeps the on-disk record of rlpipe runs: one directory per
// run, the spec it was started from, the resolved spec and memory plan,
// per-step and per-update metrics, a log, committed checkpoints that a
// later `rlpipe run --resume` continues from, and the HF export.
//
// A run directory lives under a root (DefaultRoot unless overridden) and is
// named "<YYYYMMDD-HHMMSS>-<first 8 hex digits of the run uuid>", the time
// being the creation time in UTC. It holds:
//
//	run.json              Meta: id, name, status, steps, spec dir, seed,
//	                      export, host, version, times
//	spec.yaml             the original spec bytes
//	resolved.json         the resolved spec
//	plan.json             the memory plan
//	metrics.jsonl         one JSON object per step (see Metrics)
//	updates.jsonl         one JSON object per optimizer update
//	metrics-dropped.jsonl lines removed from metrics.jsonl by a resume
//	updates-dropped.jsonl lines removed from updates.jsonl by a resume
//	log                   free-form log the caller attaches a writer to
//	checkpoints/step-N    a checkpoint; complete only once it holds the
//	                      marker file written by CommitCheckpoint
//	.lock                 flocked by the process running the run
//
// and, once written, the HF export in the directory that Meta.Exported
// names (rlpipe puts it in export/<model> inside the run directory).
//
// Every file other than the .jsonl files and log is replaced atomically
// (temporary file, fsync, rename, fsync of the directory), so a crash
// leaves either the old or the new contents, never a mix. Metric lines
// are appended and fsynced one at a time; a line cut short by a crash is
// detected and ignored by readers and removed before the next append.
//
// # Steps and updates
//
// Steps are numbered from 1. Meta.LastStep is 0 while no step has
// completed, and a checkpoint at step 0 may hold the initial weights. A
// step makes several optimizer updates (mini-batches × PPO epochs).
// AppendMetrics writes one summary line per step to metrics.jsonl, whose
// Metrics.Updates says how many updates the step made; AppendUpdate
// writes one line per update to updates.jsonl, with the step it belongs
// to, the run's global 1-based Metrics.Update index, and the 1-based
// Metrics.Epoch and Metrics.MiniBatch within the step. Both files use the
// same line format (Metrics) and are read back by Metrics and Updates.
// A step is complete, and counts in LastStep, once its summary line is
// written; its update lines come before it.
//
// # Status
//
// A run is created running and ends succeeded, failed, canceled or
// stopped (ended cleanly before its last step, as asked), as its process
// records with SetStatus. A process that dies without recording its end
// (SIGKILL, the OOM killer, a power loss) leaves run.json saying running.
// The live process holds an exclusive flock on the run's .lock, which the
// kernel releases however the process ends, so Open and List probe the
// lock of every run stored as running and report the run as interrupted
// when no process holds it. They do not rewrite run.json: reading stays
// read-only and cannot race a process that resumes the run meanwhile.
// On platforms without flock the stored status is reported unchanged.
// The probe works across hosts only where the file system shares flock
// locks between them (local disks, NFS); where locks are node-local
// (Lustre with localflock, for example), a run of another host looks
// interrupted: compare Meta.Host.
//
// # Resuming
//
// Resume accepts any run that has not succeeded, an interrupted one
// included. It takes the lock, finds the latest committed checkpoint,
// moves the lines of metrics.jsonl and updates.jsonl of later steps to
// the -dropped files, and marks the run running again. Meta.SpecDir is
// the absolute directory against which the spec's relative paths
// resolve, so the run can be resumed from any working directory using
// spec.yaml from the record; Meta.Seed is the seed of the run's random
// choices.
//
// # Export
//
// Once the HF export is complete, SetExported records its directory in
// Meta.Exported and the step it was made from (LastStep) in
// Meta.ExportedStep; Resume forgets an export made from a step later than
// the checkpoint it resumes from. A run whose training finished but whose
// export did not (the process died or failed while exporting) has its
// latest committed checkpoint at step TotalSteps and no export of that
// step: PendingExport reports exactly that, with the checkpoint to export
// from, without taking the lock, so `rlpipe run --resume` can finish the
// export instead of refusing the run as already past its last step.
// LatestCheckpoint and Checkpoints likewise only read the record.
package jobs
