// The model of the multi-process tests, shared by the worker (distributed_worker.cpp) and the
// tests that check its results against the plain model.
#pragma once

#include "detail/autocast_state.h"
#include "gpipe/checkpoint.h"
#include "gpipe/skip/skippable.h"

#include <torch/torch.h>

#include <signal.h>

#include <chrono>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gpipe {
namespace testing {

// Wall-clock time, comparable between the processes of one machine.
inline int64_t milliseconds_since_epoch() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

constexpr int64_t kDistributedLayers = 16;  // 8 Linear + Tanh pairs

// Prints "<what> at <ms since the epoch>" on stderr: the fault tests measure from that time how
// long the other ranks took to name the failure.
inline void say_when(const char* what) {
  std::cerr << what << " at " << milliseconds_since_epoch() << std::endl;
}

// Passes its input on, except that when armed, its second call (micro-batch 1) throws, kills its
// own process, hangs for an hour, stops its process (SIGSTOP) or widens its output by one column,
// as `mode` says; it says when it kills, hangs or stops.
struct TrapImpl : torch::nn::Module {
  TrapImpl(std::string mode, bool armed) : mode(std::move(mode)), armed(armed) {}

  torch::Tensor forward(torch::Tensor x) {
    if (!armed || ++calls != 2) return x;
    if (mode == "throw") throw std::runtime_error("injected failure");
    if (mode == "kill") {
      say_when("killing");
      raise(SIGKILL);
    }
    if (mode == "hang") {
      say_when("hanging");
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
    if (mode == "stop") {
      say_when("stopping");
      raise(SIGSTOP);
    }
    if (mode == "mismatch") return torch::cat({x, x.narrow(1, 0, 1)}, 1);
    return x;
  }

  std::string mode;
  bool armed;
  int calls = 0;
};
TORCH_MODULE(Trap);

// A Tanh that first adds the tensor it pops, if it pops one, and stashes its output, if it
// stashes one: the skip connections of distributed_model(..., skips = true).
struct SkipTanhImpl : torch::nn::Module, skip::Skippable {
  SkipTanhImpl(const std::string& stashes, const std::string& pops)
      : Skippable(names(stashes), names(pops)), stashes(stashes), pops(pops) {}

  torch::Tensor forward(torch::Tensor x) {
    if (!pops.empty()) x = x + pop(pops);
    x = torch::tanh(x);
    if (!stashes.empty()) stash(stashes, x);
    return x;
  }

  static std::vector<std::string> names(const std::string& name) {
    return name.empty() ? std::vector<std::string>{} : std::vector<std::string>{name};
  }

  std::string stashes, pops;
};
TORCH_MODULE(SkipTanh);

// What the Tanh layers of a recording model saw, per layer index: their input's dtype and the
// autocast settings of its device type they ran under ("Float", "BFloat16 under autocast
// BFloat16"), with " (recomputed)" for a checkpoint's recomputation. Guarded by dtype_log_mutex().
inline std::map<int64_t, std::set<std::string>>& dtype_log() {
  static std::map<int64_t, std::set<std::string>> log;
  return log;
}
inline std::mutex& dtype_log_mutex() {
  static std::mutex mutex;
  return mutex;
}

// A Tanh that writes what it sees into dtype_log().
struct RecordingTanhImpl : torch::nn::Module {
  explicit RecordingTanhImpl(int64_t layer) : layer(layer) {}
  torch::Tensor forward(torch::Tensor x) {
    std::string seen = c10::toString(x.scalar_type());
    const c10::DeviceType type = x.device().type();
    if (detail::autocast_enabled(type)) {
      seen += std::string(" under autocast ") + c10::toString(detail::autocast_dtype(type));
    }
    if (is_recomputing()) seen += " (recomputed)";
    std::lock_guard<std::mutex> lock(dtype_log_mutex());
    dtype_log()[layer].insert(seen);
    return torch::tanh(x);
  }
  int64_t layer;
};
TORCH_MODULE(RecordingTanh);

// The layers of each of `stages` stages, as even as they go.
inline std::vector<int64_t> distributed_balance(int64_t stages) {
  std::vector<int64_t> balance(stages, kDistributedLayers / stages);
  for (int64_t k = 0; k < kDistributedLayers % stages; ++k) ++balance[k];
  return balance;
}

// 8 Linear+Tanh pairs of varying widths in double precision, the same on every rank. With
// trap_stage >= 0, stage trap_stage ends in a Trap(mode, armed) and `balance` counts it. With
// `skips`, two skip connections join equal widths, layer 1's output to layer 13's input ("long")
// and layer 3's to layer 9's ("short"): on 2, 4 and 8 even stages they cross 1 to 6 stages. With
// `recording`, in single precision, and its Tanh layers are RecordingTanh.
inline torch::nn::Sequential distributed_model(std::vector<int64_t>& balance,
                                               int64_t trap_stage = -1,
                                               const std::string& mode = "", bool armed = false,
                                               bool skips = false, bool recording = false) {
  const std::map<int64_t, std::pair<std::string, std::string>> skip_tanh{
      {0, {"long", ""}}, {1, {"short", ""}}, {4, {"", "short"}}, {6, {"", "long"}}};
  torch::manual_seed(0);
  const std::vector<int64_t> widths{5, 7, 6, 8, 4, 6, 5, 7, 3};
  torch::nn::Sequential model;
  int64_t stage = 0, in_stage = 0;
  for (int64_t k = 0; k < kDistributedLayers / 2; ++k) {
    for (int64_t j = 0; j < 2; ++j) {
      if (j == 0) {
        model->push_back(torch::nn::Linear(widths[k], widths[k + 1]));
      } else if (skips && skip_tanh.count(k)) {
        model->push_back(SkipTanh(skip_tanh.at(k).first, skip_tanh.at(k).second));
      } else if (recording) {
        model->push_back(RecordingTanh(2 * k + 1));
      } else {
        model->push_back(torch::nn::Tanh());
      }
      if (++in_stage < balance[stage]) continue;
      if (stage == trap_stage) {
        model->push_back("trap", Trap(mode, armed));
        ++balance[stage];
      }
      ++stage;
      in_stage = 0;
    }
  }
  model->to(recording ? torch::kFloat : torch::kDouble);
  return model;
}

// A language model's tied weights, small: token ids [B] -> TokenEmbedding [B, C] -> 7 Linear+Tanh
// pairs -> OutputProjection [B, V], whose weight is the embedding's (logits = x E^T).
constexpr int64_t kTiedVocabulary = 11;
constexpr int64_t kTiedWidth = 6;

struct TokenEmbeddingImpl : torch::nn::Module {
  TokenEmbeddingImpl()
      : weight(register_parameter("weight", torch::randn({kTiedVocabulary, kTiedWidth}))) {}
  torch::Tensor forward(torch::Tensor tokens) { return torch::embedding(weight, tokens); }
  torch::Tensor weight;
};
TORCH_MODULE(TokenEmbedding);

struct OutputProjectionImpl : torch::nn::Module {
  explicit OutputProjectionImpl(torch::Tensor tied) : weight(register_parameter("weight", tied)) {}
  torch::Tensor forward(torch::Tensor x) { return torch::matmul(x, weight.t()); }
  torch::Tensor weight;
};
TORCH_MODULE(OutputProjection);

// The tied model in double precision, kDistributedLayers layers, the same on every rank: layer 0
// and the last layer share one parameter.
inline torch::nn::Sequential tied_model() {
  torch::manual_seed(0);
  torch::nn::Sequential model;
  TokenEmbedding embedding;
  model->push_back(embedding);
  for (int64_t k = 0; k < (kDistributedLayers - 2) / 2; ++k) {
    model->push_back(torch::nn::Linear(kTiedWidth, kTiedWidth));
    model->push_back(torch::nn::Tanh());
  }
  model->push_back(OutputProjection(embedding->weight));
  model->to(torch::kDouble);
  return model;
}

// Its batch: 16 token ids and their targets.
inline std::pair<torch::Tensor, torch::Tensor> tied_batch() {
  torch::manual_seed(4321);
  return {torch::randint(kTiedVocabulary, {16}, torch::kLong),
          torch::randn({16, kTiedVocabulary}, torch::kDouble)};
}

// The batch of the tests: 10 samples, so 4 micro-batches are uneven (3, 3, 3, 1).
inline std::pair<torch::Tensor, torch::Tensor> distributed_batch() {
  torch::manual_seed(1234);
  // 16 rows: up to 8 micro-batches of 2, which DualPipeV on 4 ranks (8 stages) needs.
  torch::Tensor input = torch::randn({16, 5}, torch::kDouble);
  torch::Tensor target = torch::randn({16, 3}, torch::kDouble);
  return {input, target};
}

}  // namespace testing
}  // namespace gpipe
