#!/usr/bin/env python3
"""Summarizes nvidia-smi samples taken while a benchmark ran.

The input is the CSV that bench/device_lib.sh's budgeted writes (nvidia-smi
--query-gpu=index,utilization.gpu,clocks.sm,power.draw,
clocks_throttle_reasons.active --format=csv,noheader,nounits). Samples with
the GPU at least 90% utilized are the busy ones (the timed steps, mostly);
the line printed gives their number, the median SM clock and power, and the
share of them whose throttle reasons include the software power cap
(0x4). A step at the benchmark's sizes runs at the power cap, at a clock
that depends on the data (docs/performance.md, "the head in one kernel"),
so two runs' speeds compare fairly only with their clocks beside them.

    python3 bench/smi_summary.py RUN.smi.csv
"""
import statistics
import sys

POWER_CAP = 0x4


def summarize(lines):
    busy = []
    for line in lines:
        f = [x.strip() for x in line.split(",")]
        if len(f) < 5:
            continue
        try:
            util, clk, watts = float(f[1]), float(f[2]), float(f[3])
            reasons = int(f[4], 16)
        except ValueError:
            continue
        if util >= 90:
            busy.append((clk, watts, reasons))
    if not busy:
        return "no busy samples"
    capped = sum(1 for _, _, r in busy if r & POWER_CAP)
    return (f"{len(busy)} busy samples: SM clock median {statistics.median(c for c, _, _ in busy):.0f} MHz, "
            f"power median {statistics.median(w for _, w, _ in busy):.0f} W, power cap in {100 * capped / len(busy):.0f}%")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: smi_summary.py RUN.smi.csv")
    with open(sys.argv[1]) as f:
        print(summarize(f))
