"""torchgpipe's side of the gpu_pipeline benchmark (benchmarks/gpu-pipeline/main.cpp).

gpu_pipeline starts this script and sends it one JSON request per line on stdin; it answers each
with one JSON line on stdout ({"error": "..."} where a request fails) and ends when stdin closes:

  {"op": "hello"}
      -> {"python", "torch", "torchgpipe"}: the versions.
  {"op": "setup", "model": "resnet", "options": {...}, "state": PATH, "device": "cuda:0",
   "threads": N, "contenders": [{"name", "balance", "chunks", "checkpoint"}, ...]}
      -> {"losses": {name: loss}}. Builds twin_models.<model>(**options) once per contender,
      loads the weights gpu_pipeline saved in PATH (torch.load: "model.<name>" tensors, "input"
      and "target"), wraps it in torchgpipe.GPipe over `balance` on the one device (an empty
      balance: the plain model), and returns each one's forward loss before any step.
  {"op": "step", "contender": NAME}
      -> {"ms", "peak_mib"}: one training step (SGD, learning rate 0.01) and its peak memory
      above what the device held before it (CUDA's caching allocator; null on the CPU).
  {"op": "trace", "contender": NAME, "path": PATH}
      -> {}: one step more under torch.profiler, written to PATH as a Chrome trace, each of
      torchgpipe's tasks a span "torchgpipe::compute" / "torchgpipe::finalize" (as gpipe's
      tasks are spans in profiled_step.h's traces).

torchgpipe 0.0.7 must be importable: PYTHONPATH may name its wheel (scripts/gpu-check.sh does).
"""

import contextlib
import json
import sys
import time

import torch
import torch.jit._pickle  # restore_type_tag, see load_state()
import torch.nn.functional as F

import torchgpipe
import torchgpipe.worker
import twin_models


def loss(output, target):
    """Cross entropy against class labels, MSE against a float target: main.cpp's loss_of()."""
    target = target.to(output.device)
    if target.dtype == torch.long:
        return F.cross_entropy(output, target)
    return F.mse_loss(output, target)


@contextlib.contextmanager
def tasks_as_spans():
    """Makes each of torchgpipe's tasks a span of the profiler's trace, while it lasts (not while
    timing: a span costs a few microseconds)."""
    task = torchgpipe.worker.Task
    compute, finalize = task.compute, task.finalize

    def spanned(method, name):
        def run(self, *args):
            with torch.profiler.record_function(name):
                return method(self, *args)
        return run

    task.compute = spanned(compute, "torchgpipe::compute")
    task.finalize = spanned(finalize, "torchgpipe::finalize")
    try:
        yield
    finally:
        task.compute, task.finalize = compute, finalize


def load_state(path):
    """The tensors that main.cpp saved with torch::pickle_save: a typed dict, whose type tag
    is the one global torch.load must be allowed to call."""
    with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
        return torch.load(path, weights_only=True)


class Contender:
    """One model: the twin loaded with gpu_pipeline's weights, plain or as a GPipe pipeline."""

    def __init__(self, spec, model, options, state, device):
        module = getattr(twin_models, model)(**options)
        module.load_state_dict(
            {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")},
            strict=True)
        if spec["balance"]:
            module = torchgpipe.GPipe(module, spec["balance"],
                                      devices=[device] * len(spec["balance"]),
                                      chunks=spec["chunks"], checkpoint=spec["checkpoint"])
        else:
            module = module.to(device)
        self.module = module
        self.device = torch.device(device)
        self.input = state["input"].to(device)
        self.target = state["target"].to(device)
        self.optimizer = torch.optim.SGD(module.parameters(), lr=0.01)

    def forward_loss(self):
        return loss(self.module(self.input), self.target).item()

    def trace(self, path):
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # torchgpipe's workers run the tasks on threads of their own.
        config = torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True,
                                                        profile_all_threads=True)
        with tasks_as_spans(), torch.profiler.profile(activities=activities,
                                                      experimental_config=config) as prof:
            with torch.profiler.record_function("gpu_pipeline::step"):
                self.step()
        prof.export_chrome_trace(path)
        return {}

    def step(self):
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
        start = time.perf_counter()
        self.optimizer.zero_grad()
        loss(self.module(self.input), self.target).backward()
        self.optimizer.step()
        if cuda:
            torch.cuda.synchronize(self.device)
        ms = 1000 * (time.perf_counter() - start)
        peak = (torch.cuda.max_memory_allocated(self.device) - before) / 2**20 if cuda else None
        return {"ms": ms, "peak_mib": peak}


def serve(requests, replies):
    contenders = {}
    for line in requests:
        request = json.loads(line)
        try:
            op = request["op"]
            if op == "hello":
                reply = {"python": sys.version.split()[0], "torch": torch.__version__,
                         "torchgpipe": torchgpipe.__version__}
            elif op == "setup":
                contenders.clear()  # the previous model's memory goes before the next one's
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                torch.set_num_threads(request["threads"])
                state = load_state(request["state"])
                for spec in request["contenders"]:
                    contenders[spec["name"]] = Contender(spec, request["model"],
                                                         request["options"], state,
                                                         request["device"])
                reply = {"losses": {name: c.forward_loss() for name, c in contenders.items()}}
            elif op == "step":
                reply = contenders[request["contender"]].step()
            elif op == "trace":
                reply = contenders[request["contender"]].trace(request["path"])
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as error:  # the benchmark reports it and stops
            reply = {"error": f"{type(error).__name__}: {error}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    # Only the replies go to stdout; anything printed on the way goes to stderr.
    replies, sys.stdout = sys.stdout, sys.stderr
    serve(sys.stdin, replies)
