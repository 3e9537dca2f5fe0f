"""Where one step's time goes: reads the Chrome traces that `gpu_pipeline --trace DIR` writes
(<model>.<contender>.<side>.json: gpipe's from profiled_step.h, torchgpipe's from
torchgpipe_side.py) and prints, per trace:

  step ms       the profiled step (its "gpu_pipeline::step" span)
  tasks         the pipeline's task spans (gpipe::forward/recompute, torchgpipe::compute/finalize):
                how many, and the median host time of one
  task GPU      the median GPU time of one task: its kernels and copies, found through the
                correlation of each launch inside the task's span with what ran on the GPU
  GPU busy      the union of all kernels and copies within the step
  GPU idle      the step's time with nothing on the GPU, in gaps: how many over 10 us, the largest
  syncs         synchronizations (cudaDeviceSynchronize, cudaStreamSynchronize,
                cudaEventSynchronize and the profiler's cuda_sync events) and stream waits
                (cudaStreamWaitEvent)

On the CPU there are no GPU columns: only the step and the host time of the tasks.

  python trace_summary.py DIR [--json FILE]
"""

import argparse
import glob
import json
import os
import statistics

SYNC_CALLS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize"}
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
TASK_PREFIXES = ("gpipe::", "torchgpipe::")
GAP_US = 10


def union_length(intervals):
    """The length covered by (start, end) intervals, and the gaps between them."""
    covered, gaps, end = 0.0, [], None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            if end is not None:
                gaps.append(start - end)
            covered += stop - start
            end = stop
        elif stop > end:
            covered += stop - end
            end = stop
    return covered, gaps


def summarize(path):
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    step = next(e for e in events if e["name"] == "gpu_pipeline::step")
    start, stop = step["ts"], step["ts"] + step["dur"]
    within = [e for e in events if start <= e["ts"] <= stop]
    tasks = [e for e in within
             if e.get("cat") == "user_annotation" and e["name"].startswith(TASK_PREFIXES)]
    gpu = [e for e in within if e.get("cat") in GPU_CATEGORIES]
    runtime = [e for e in within if e.get("cat") == "cuda_runtime"]
    on_gpu = {}  # correlation -> GPU microseconds
    for e in gpu:
        correlation = e.get("args", {}).get("correlation")
        on_gpu[correlation] = on_gpu.get(correlation, 0) + e["dur"]

    def task_gpu_us(task):
        end = task["ts"] + task["dur"]
        return sum(on_gpu.get(r.get("args", {}).get("correlation"), 0) for r in runtime
                   if r["tid"] == task["tid"] and task["ts"] <= r["ts"] <= end)

    summary = {
        "step_ms": step["dur"] / 1000,
        "tasks": len(tasks),
        "task_host_ms": statistics.median(t["dur"] for t in tasks) / 1000 if tasks else None,
    }
    if gpu:
        busy, gaps = union_length([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
        long_gaps = [g for g in gaps if g > GAP_US]
        summary.update({
            "task_gpu_ms": statistics.median(task_gpu_us(t) for t in tasks) / 1000
            if tasks else None,
            "gpu_ops": len(gpu),
            "gpu_busy_ms": busy / 1000,
            "gpu_idle_ms": (step["dur"] - busy) / 1000,
            "gaps_over_10us": len(long_gaps),
            "largest_gap_ms": max(long_gaps, default=0) / 1000,
            "syncs": sum(1 for e in within if e.get("cat") == "cuda_sync"
                         or e["name"] in SYNC_CALLS),
            "stream_waits": sum(1 for e in runtime if e["name"] == "cudaStreamWaitEvent"),
        })
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir")
    parser.add_argument("--json", help="write the summaries there too")
    args = parser.parse_args()
    rows = []
    for path in sorted(glob.glob(os.path.join(args.dir, "*.*.*.json"))):
        model, contender, side = os.path.basename(path)[:-len(".json")].rsplit(".", 2)
        rows.append({"model": model, "contender": contender, "side": side, **summarize(path)})
    if not rows:
        raise SystemExit(f"trace_summary: no traces in {args.dir}")
    columns = ["model", "contender", "side", "step_ms", "tasks", "task_host_ms", "task_gpu_ms",
               "gpu_busy_ms", "gpu_idle_ms", "gaps_over_10us", "largest_gap_ms", "syncs",
               "stream_waits"]
    columns = [c for c in columns if any(c in row for row in rows)]

    def cell(value):
        if value is None:
            return "-"
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    table = [columns] + [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(line[k]) for line in table) for k in range(len(columns))]
    for n, line in enumerate(table):
        print("  ".join(v.ljust(w) if k < 3 else v.rjust(w)
                        for k, (v, w) in enumerate(zip(line, widths))))
        if n == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=2)


if __name__ == "__main__":
    main()
