#include "detail/checkpointing.h"

#include "detail/autocast_state.h"
#include "detail/dependency.h"
#include "detail/differentiable.h"
#include "detail/phony.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <mutex>
#include <utility>

namespace gpipe {
namespace detail {

namespace {

// Behind is_checkpointing() and is_recomputing() (gpipe/checkpoint.h).
thread_local bool checkpointing = false;
thread_local bool recomputing = false;

}  // namespace

EnableCheckpointing::EnableCheckpointing() : FlagScope(checkpointing) {}
bool EnableCheckpointing::active() { return checkpointing; }

EnableRecomputing::EnableRecomputing() : FlagScope(recomputing) {}
bool EnableRecomputing::active() { return recomputing; }

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The states of the generators a function on `device` may draw from: CPU's, and the device's own.
struct RngStates {
  at::Tensor cpu;
  at::Tensor device;  // undefined for CPU
};

std::vector<at::Generator> generators_for(c10::Device device) {
  std::vector<at::Generator> generators{at::globalContext().defaultGenerator(c10::kCPU)};
  if (!device.is_cpu()) generators.push_back(at::globalContext().defaultGenerator(device));
  return generators;
}

at::Tensor get_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

RngStates save_rng_states(c10::Device device) {
  auto generators = generators_for(device);
  RngStates states{get_state(generators[0]), {}};
  if (generators.size() > 1) states.device = get_state(generators[1]);
  return states;
}

// Sets the generators to `saved` for a scope and puts back what they were (torch.random.fork_rng).
class RestoredRngStates {
 public:
  RestoredRngStates(c10::Device device, const RngStates& saved)
      : device_(device), outer_(save_rng_states(device)) {
    apply(saved);
  }
  ~RestoredRngStates() { apply(outer_); }

 private:
  void apply(const RngStates& states) {
    auto generators = generators_for(device_);
    set_state(generators[0], states.cpu);
    if (generators.size() > 1) set_state(generators[1], states.device);
  }

  c10::Device device_;
  RngStates outer_;
};

Batch make_batch(std::vector<at::Tensor> tensors, bool atomic) {
  if (atomic) return Batch(std::move(tensors[0]));
  return Batch(std::move(tensors));
}

}  // namespace

struct CheckpointState : torch::CustomClassHolder {
  BatchFunction function;
  bool input_atomic = true;
  bool output_atomic = true;
  c10::Device device{c10::kCPU};
  RngStates rng_states;
  AutocastState autocast;  // the forward's, for the recomputation
  // Set by Recompute's backward, taken by Checkpoint's.
  c10::optional<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> recomputed;
};

namespace {

c10::intrusive_ptr<CheckpointState> state_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
}

// [2] in pipeline/pipeline.h: computes under no-grad (Function::apply disables it), keeping
// nothing.
struct Checkpoint : torch::autograd::Function<Checkpoint> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& /*phony*/,
                               c10::intrusive_ptr<CheckpointState> state, at::TensorList input) {
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    state->rng_states = save_rng_states(state->device);
    state->autocast = AutocastState::current();
    Batch output = [&] {
      // No cast cached under no-grad (autocast_state.h).
      UseAutocast autocast(state->autocast);
      EnableCheckpointing flag;
      return state->function(make_batch(input.vec(), state->input_atomic));
    }();
    state->output_atomic = output.atomic();
    variable_list outputs = output.tensors();
    mark_non_differentiable(ctx, outputs);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_output) {
    auto state = state_of(ctx);
    TORCH_INTERNAL_ASSERT(state->recomputed, "Checkpoint's backward ran before Recompute's");
    auto recomputed = std::move(*state->recomputed);
    state->recomputed.reset();
    const auto& [output, input_leaves] = recomputed;

    variable_list tensors, grads;
    for (size_t k = 0; k < output.size(); ++k) {
      if (output[k].requires_grad()) {
        tensors.push_back(output[k]);
        grads.push_back(grad_output[k]);
      }
    }
    if (!tensors.empty()) torch::autograd::backward(tensors, grads);

    variable_list grad_input{at::Tensor(), at::Tensor()};  // the phony, the state
    for (const auto& leaf : input_leaves) grad_input.push_back(leaf.grad());
    return grad_input;
  }
};

// [4] in pipeline/pipeline.h: runs before Checkpoint's backward and recomputes with grad.
struct Recompute : torch::autograd::Function<Recompute> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& phony,
                            c10::intrusive_ptr<CheckpointState> state, at::TensorList input) {
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    ctx->save_for_backward(input.vec());
    return phony.detach();
  }

  static variable_list backward(AutogradContext* ctx, variable_list /*grad*/) {
    auto state = state_of(ctx);
    variable_list input = ctx->get_saved_variables();
    std::vector<at::Tensor> leaves;
    leaves.reserve(input.size());
    for (const auto& x : input) leaves.push_back(x.detach().requires_grad_(x.requires_grad()));

    RestoredRngStates rng(state->device, state->rng_states);
    // As the forward ran, whether or not backward runs under autocast (torch.utils.checkpoint).
    UseAutocast autocast(state->autocast);
    torch::autograd::AutoGradMode enable_grad(true);
    EnableRecomputing flag;
    Batch output = state->function(make_batch(leaves, state->input_atomic));
    state->recomputed.emplace(output.tensors(), std::move(leaves));
    return variable_list(2 + input.size());  // the phony, the state, the inputs: none
  }
};

}  // namespace

Checkpointing::Checkpointing(BatchFunction function, Batch input)
    : state_(c10::make_intrusive<CheckpointState>()), input_(std::move(input)) {
  state_->function = std::move(function);
  state_->input_atomic = input_.atomic();
  state_->device = input_[0].device();
}

Checkpointing::~Checkpointing() = default;

Batch Checkpointing::checkpoint() {
  // A phony that requires grad keeps Checkpoint in the graph even when no input requires grad.
  const at::Tensor phony = get_phony(input_[0].device(), /*requires_grad=*/true);
  variable_list output = Checkpoint::apply(phony, state_, at::TensorList(input_.tensors()));
  for (auto& y : output) {
    if (!differentiable(y)) y = y.detach();
  }
  return make_batch(std::move(output), state_->output_atomic);
}

void Checkpointing::recompute(Batch& output) {
  // Hang Recompute on the first tensor that requires grad (none means no backward), and join it
  // into every such tensor: backward may reach Checkpoint through any of them, and must find
  // Recompute done first.
  c10::optional<at::Tensor> recomputed;
  for (size_t k = 0; k < output.size(); ++k) {
    if (!output[k].requires_grad()) continue;
    if (!recomputed) {
      auto [tensor, phony] = fork(output[k]);
      recomputed = Recompute::apply(phony, state_, at::TensorList(input_.tensors()));
      output[k] = tensor;
    }
    output[k] = join(output[k], *recomputed);
  }
}

}  // namespace detail
}  // namespace gpipe
