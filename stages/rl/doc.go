// Package rl holds the host-side reinforcement-learning math of the train
// stage: advantages from rewards, the policy loss (the PPO/GRPO/GSPO clipped
// surrogate or CISPO, optionally corrected by truncated importance sampling)
// with KL and entropy terms over one packed micro-batch, normalised over its
// mini-batch by one of four aggregations, the exact gradient of that loss
// with respect to every per-token log-prob and entropy, the learning-rate
// schedule and the gradient-clipping coefficient.
//
// The formulas reproduce the slime FSDP trainer (see docs/rl.md). The model
// computes the per-token log-probs l_t and entropies H_t of the response
// tokens; ComputeLoss turns them into the micro-batch's share of the
// mini-batch loss and metrics and the gradients dL/dl_t and dL/dH_t, which
// the model backward then pushes through the log-prob and entropy
// computation.
//
// All arithmetic is done in float64; inputs and gradients are float32.
package rl
