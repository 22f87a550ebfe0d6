#!/usr/bin/env python3
"""How often a GPU's NVML energy counter moves.

Reads nvmlDeviceGetTotalEnergyConsumption of GPU INDEX (NVML's numbering)
every millisecond for SECONDS and prints the number of reads, the time of
one read, and the intervals between the counter's changes (median and
largest) with the mean power over the whole: rlbench and peer_fsdp2.py read
the counter at each stage's syncs, so a stage's joules are good to about
one such interval's energy. Run it beside a benchmark.

    python3 bench/energy_probe.py [SECONDS] [INDEX]
"""
import ctypes
import statistics
import sys
import time


def main(argv):
    secs = float(argv[1]) if len(argv) > 1 else 5.0
    index = int(argv[2]) if len(argv) > 2 else 0
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    if lib.nvmlInit_v2() != 0:
        sys.exit("energy_probe: nvmlInit failed")
    h = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(h)) != 0:
        sys.exit(f"energy_probe: no GPU {index}")
    mj = ctypes.c_ulonglong()
    changes, reads, cost = [], 0, []
    last = None
    end = time.perf_counter() + secs
    t0 = time.perf_counter()
    first = None
    while True:
        a = time.perf_counter()
        if a > end:
            break
        if lib.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(mj)) != 0:
            sys.exit("energy_probe: the counter cannot be read")
        b = time.perf_counter()
        cost.append(b - a)
        reads += 1
        if first is None:
            first = (b, mj.value)
        if mj.value != last:
            changes.append(b)
            last = mj.value
        time.sleep(0.001)
    gaps = [y - x for x, y in zip(changes, changes[1:])]
    span = time.perf_counter() - t0
    watts = (mj.value - first[1]) / 1e3 / max(b - first[0], 1e-9)
    if not gaps:
        print(f"{reads} reads in {span:.1f}s, one read {1e6 * statistics.median(cost):.0f} µs: the counter did not move")
        return 0
    print(f"{reads} reads in {span:.1f}s, one read {1e6 * statistics.median(cost):.0f} µs; the counter moved {len(gaps)} times, "
          f"every {1e3 * statistics.median(gaps):.1f} ms (median; largest {1e3 * max(gaps):.1f} ms); mean power {watts:.0f} W")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
