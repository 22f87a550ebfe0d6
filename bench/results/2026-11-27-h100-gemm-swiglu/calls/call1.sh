#!/bin/bash
# Session 17, call 1: bench/gemm_swiglu_device.sh as of the build in README.md (.devbin: rlbench, cuda.test).
OUT=$OUT bash bench/gemm_swiglu_device.sh
