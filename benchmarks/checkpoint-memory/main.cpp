// Checkpoint memory: peak CPU memory of one training step of the default model of `gpipe train`
// (the char GPT) under GPipe with checkpoint never / except_last / always, for several numbers
// of micro-batches M and partitions K, measured with the tracking allocator; each mode's ratio
// to never; and the GPipe paper's claim held against it.
//
// The claim: with checkpointing, activation memory is O(N + L/K x N/M) - every partition keeps
// only its input of each micro-batch (K boundary tensors of the whole batch, the N term), plus
// the activations of the one partition of one micro-batch being recomputed (L/K layers of N/M
// samples) - against O(N x L) without. The prediction below takes the per-layer cost c from the
// never run (never ~ N L c) and the boundary cost b from the model's width (a block's input is
// T x C floats per sample): always ~ K N b + (L/K) (N/M) c.
//
// Usage: checkpoint_memory [batch=32] [layers=4] [embedding_dim=128] [block_size=64]
#include "common/bench_util.h"
#include "models/char_gpt.h"

#include "gpipe/balance/balance.h"
#include "gpipe/memory.h"
#include "gpipe/pipe.h"

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using gpipe::bench::mib;

// The peak of one training step above what was allocated before it (parameters, their grads).
int64_t step_peak(gpipe::GPipe& model, const torch::Tensor& input, const torch::Tensor& target) {
  auto run = [&] {
    auto loss = gpipe::models::char_gpt_loss(model->forward(input), target);
    loss.backward();
  };
  run();  // grads now exist, as in training
  const int64_t before = gpipe::memory::cpu_current_bytes();
  gpipe::memory::reset_cpu_peak();
  run();
  return gpipe::memory::cpu_peak_bytes() - before;
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int k, long long fallback) { return argc > k ? std::atoll(argv[k]) : fallback; };
  const int64_t N = arg(1, 32);
  const auto options = gpipe::models::CharGPTOptions()
                           .num_layers(arg(2, 4))
                           .embedding_dim(arg(3, 128))
                           .block_size(arg(4, 64))
                           .tie_embeddings(false);  // GPipe refuses parameters shared by partitions
  torch::set_num_threads(1);
  gpipe::memory::install_tracking_cpu_allocator();
  torch::manual_seed(0);
  const auto input = torch::randint(256, {N, options.block_size()}, torch::kLong);
  const auto target = torch::randint(256, {N, options.block_size()}, torch::kLong);
  torch::nn::Sequential sequential = gpipe::models::char_gpt(options);
  const int64_t L = static_cast<int64_t>(sequential->size());
  // A block's input: T x C floats per sample.
  const double b = static_cast<double>(options.block_size() * options.embedding_dim() * 4);

  std::printf("char GPT (%lld blocks, width %lld, context %lld): L = %lld layers, batch N = %lld\n",
              static_cast<long long>(options.num_layers()),
              static_cast<long long>(options.embedding_dim()),
              static_cast<long long>(options.block_size()), static_cast<long long>(L),
              static_cast<long long>(N));
  std::printf("peak MiB of one training step above parameters and gradients\n\n");
  std::printf("%3s %4s %10s %12s %10s %10s %10s %14s %10s\n", "K", "M", "never", "except_last",
              "always", "e_l/never", "alw/never", "predicted alw", "alw/pred");
  for (const int64_t K : {int64_t{2}, int64_t{3}}) {
    for (const int64_t M : {1, 2, 4, 8, 16, 32}) {
      if (M > N) continue;
      double peak[3];
      int index = 0;
      for (const auto mode : {gpipe::CheckpointMode::kNever, gpipe::CheckpointMode::kExceptLast,
                              gpipe::CheckpointMode::kAlways}) {
        gpipe::GPipe model(
            sequential,
            gpipe::GPipeOptions(gpipe::balance::balance_by_count(K, L)).chunks(M).checkpoint(mode));
        peak[index++] = static_cast<double>(step_peak(model, input, target));
        model->zero_grad();
      }
      const double c = peak[0] / static_cast<double>(N * L);
      const double predicted = static_cast<double>(K * N) * b +
                               static_cast<double>(L) / static_cast<double>(K) *
                                   (static_cast<double>(N) / static_cast<double>(M)) * c;
      std::printf("%3lld %4lld %10.1f %12.1f %10.1f %9.3fx %9.3fx %14.1f %9.2fx\n",
                  static_cast<long long>(K), static_cast<long long>(M), mib(peak[0]), mib(peak[1]),
                  mib(peak[2]), peak[1] / peak[0], peak[2] / peak[0], mib(predicted),
                  peak[2] / predicted);
    }
  }
  std::printf(
      "\npredicted always = K N b + (L/K)(N/M) c, with b = T x C x 4 bytes (a block's input per\n"
      "sample) and c = never / (N L): the GPipe paper's O(N + L/K x N/M). The claim is about\n"
      "scaling: alw/pred staying about constant over K and M means it holds (the constant is\n"
      "what O() leaves out); never stays ~N L c whatever M.\n");
  return 0;
}
