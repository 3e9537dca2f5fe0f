"""One rank of torch.distributed.pipelining, the peer that benchmarks/peers/main.cpp measures gpipe
against: the same model, weights, batch, micro-batches, stage layout and schedule as gpipe's ranks
there, over Gloo on the CPU with 1 intra-op thread.

Started by the `peers` benchmark (or torchrun) with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT:

  python pipelining.py --width 64 --layers 32 --batch 256 --chunks 32 --schedule 1f1b \
      --steps 3 --warmup 1 --out /tmp/x/result

The model is `layers` x (Linear(width, width) + Tanh) whose weights, input and target come from a
formula (weights() below, the same in main.cpp), computed by the same LibTorch on both sides, so
they are bit for bit equal. Stage s of S = WORLD_SIZE x v holds layers [s L / S, (s + 1) L / S);
rank r holds stages r, r + W, ... (v = 2 for the interleaved schedules and looped BFS), or r and
2W - 1 - r under ZBV. The loss is MSE (mean) per micro-batch, gradients scaled by 1 / M (the
schedules' default), so they equal one backward of the full batch's MSE, as gpipe's do.

Writes <out>.rank<r>.json (every timed step's seconds, RSS in KiB before the first step and its
peak at the end, the loss on the last stage's rank) and <out>.rank<r>.pt (the gradients of this
rank's layers after the last step, keyed "<layer>.weight" / "<layer>.bias").
"""

import argparse
import ctypes
import json
import math
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining as pp

SCHEDULES = {
    # gpipe's name: (torch.distributed.pipelining's class, stages per rank, V placement)
    "gpipe": (pp.ScheduleGPipe, 1, False),
    "1f1b": (pp.Schedule1F1B, 1, False),
    "interleaved_1f1b": (pp.ScheduleInterleaved1F1B, 2, False),
    "zb1p": (pp.ScheduleInterleavedZeroBubble, 1, False),
    "interleaved_zb1p": (pp.ScheduleInterleavedZeroBubble, 2, False),
    "zbv": (pp.ScheduleZBVZeroBubble, 2, True),
    "looped_bfs": (pp.ScheduleLoopedBFS, 2, False),
}


def formula(n, salt):
    """n values in [-0.5, 0.5) from a hash of their index (float64); main.cpp computes the same."""
    k = torch.arange(n, dtype=torch.float64)
    x = torch.sin(k * 12.9898 + salt * 78.233) * 43758.5453
    return x - torch.floor(x) - 0.5


def weights(layer, width):
    """Layer `layer`'s weight and bias: unit-variance hash values scaled by 1 / sqrt(width)."""
    scale = math.sqrt(12.0 / width)
    w = (formula(width * width, 2 * layer + 1) * scale).float().reshape(width, width)
    b = (formula(width, 2 * layer + 2) * scale).float()
    return w, b


def batch(rows, width):
    x = (formula(rows * width, -1) * 2.0).float().reshape(rows, width)
    y = (formula(rows * width, -2) * 2.0).float().reshape(rows, width)
    return x, y


def skip_self_connections():
    """ZBV's V turns within rank W - 1 (stages W - 1 and W), and PipelineStage's first step opens
    the links to each stage's neighbours by sending a tensor to and receiving one from each,
    to that rank itself too, which Gloo refuses: "[enforce fail at gloo/transport/tcp/pair.cc:789]
    state_ >= CONNECTED. 1 vs 4. Pair is not connected". The schedule itself passes tensors
    between the two stages within the rank, so leave those links out."""
    original = pp.stage._PipelineStageBase._get_init_p2p_neighbors_ops

    def ops(self):
        return [op for op in original(self) if op.peer != dist.get_rank()]

    pp.stage._PipelineStageBase._get_init_p2p_neighbors_ops = ops


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def settled_rss_kib():
    """The resident set the step starts from: freed heap memory given back, so that the step
    cannot reuse it unseen, and the peak (VmHWM) reset to it; as main.cpp's settled_rss_kib()."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_kib("VmRSS")


def main():
    parser = argparse.ArgumentParser()
    for name in ("width", "layers", "batch", "chunks", "steps", "warmup"):
        parser.add_argument("--" + name, type=int, required=True)
    parser.add_argument("--schedule", required=True, choices=sorted(SCHEDULES))
    parser.add_argument("--out", required=True)
    a = parser.parse_args()

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cls, per_rank, v_shape = SCHEDULES[a.schedule]
    if v_shape:
        skip_self_connections()
    num_stages = world * per_rank
    if v_shape:
        indices = [rank, 2 * world - 1 - rank]
    else:
        indices = [rank + k * world for k in range(per_rank)]
    per_stage = a.layers // num_stages
    assert per_stage * num_stages == a.layers, "layers must divide into the stages"

    stages, modules, names = [], [], {}
    for s in indices:
        layers = []
        for layer in range(s * per_stage, (s + 1) * per_stage):
            linear = nn.Linear(a.width, a.width)
            w, b = weights(layer, a.width)
            with torch.no_grad():
                linear.weight.copy_(w)
                linear.bias.copy_(b)
            names[linear.weight] = f"{layer}.weight"
            names[linear.bias] = f"{layer}.bias"
            layers += [linear, nn.Tanh()]
        module = nn.Sequential(*layers)
        modules.append(module)
        # Shapes given, so no shape inference: its send_object_list needs NumPy.
        shape = torch.empty(a.batch // a.chunks, a.width, device="meta")
        stages.append(
            pp.PipelineStage(
                module, s, num_stages, torch.device("cpu"), input_args=shape, output_args=shape
            )
        )
    mse = nn.MSELoss()
    if per_rank == 1 and cls in (pp.ScheduleGPipe, pp.Schedule1F1B):
        schedule = cls(stages[0], a.chunks, loss_fn=mse)
    else:
        schedule = cls(stages, a.chunks, loss_fn=mse)
    x, y = batch(a.batch, a.width)
    first, last = 0 in indices, num_stages - 1 in indices
    # Only the first stage's rank may pass the input, only the last stage's the target.
    args = (x,) if first else ()

    rss_before = settled_rss_kib()
    times, cpu, loss = [], [], None
    for step in range(a.warmup + a.steps):
        for m in modules:
            m.zero_grad(set_to_none=True)
        losses = []
        cpu_start = time.process_time()
        start = time.perf_counter()
        if last:
            schedule.step(*args, target=y, losses=losses)
        else:
            schedule.step(*args)
        elapsed = time.perf_counter() - start
        used = time.process_time() - cpu_start
        if step >= a.warmup:
            times.append(elapsed)
            cpu.append(used)
        if last:
            loss = float(torch.stack(losses).mean())
    # No rank writes its results, or exits, and takes a core for it while another still runs
    # its last step (so does gpipe's side).
    dist.barrier()
    report = {
        "steps": times,
        "cpu": cpu,
        "rss_before_kib": rss_before,
        "hwm_kib": status_kib("VmHWM"),
        "loss": loss,
    }
    grads = {names[p]: p.grad for m in modules for p in m.parameters()}
    torch.save(grads, f"{a.out}.rank{rank}.pt")
    with open(f"{a.out}.rank{rank}.json", "w") as f:
        json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
