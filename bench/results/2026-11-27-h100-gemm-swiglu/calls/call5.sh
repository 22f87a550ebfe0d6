#!/bin/bash
# Session 17, call 5: calls/variants.sh (copied to bench/ for the call) with the variants of README.md, gzipped in .devbin.
OUT=$OUT bash bench/gemm_swiglu_variants.sh
