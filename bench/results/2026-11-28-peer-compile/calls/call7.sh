#!/usr/bin/env bash
# Call 7 (H100): the peer's self-test and its CPU smoke test, which now
# also runs the peer with --compile layers.
set -u
timeout 200 python3 bench/peer_fsdp2.py --selftest >"$OUT/peer_smoke.txt" 2>&1
echo "selftest rc=$?" >>"$OUT/peer_smoke.txt"
timeout 200 python3 bench/peer_smoke.py >>"$OUT/peer_smoke.txt" 2>&1
echo "smoke rc=$?" >>"$OUT/peer_smoke.txt"
tail -5 "$OUT/peer_smoke.txt"
