// Package libnccl is the binding to NVIDIA's NCCL (libnccl, loaded at run
// time with cgo and dlopen): nccl.Comm over the GPUs of one process
// (NewComms, ncclCommInitAll; NewGroups for groups of them) or one rank per
// process (NewRank, ncclCommInitRank bootstrapped over a host
// communicator; Split for the rank's group, ncclCommSplit). Package nccl
// holds the interface and the pure-Go communicators; without cgo this
// package is empty.
package libnccl
