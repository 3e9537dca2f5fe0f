// A small GPT-style character language model as a flat Sequential, the default model of the
// `gpipe` command and of its benchmarks.
//
//   bytes [B, T] -> Embedding (token + position) -> Block x num_layers -> Head -> logits [B, T, V]
//
// As in GPT-2 and T5, the head projects with the token embedding's weight (tie_embeddings): one
// parameter in the first layer and the last, which a pipeline's first and last stages share.
//
// A Block is a pre-norm transformer layer: x + attention(norm(x)), then x + mlp(norm(x)), with
// causal multi-head self-attention written out (matmul, mask, softmax) so it runs on every
// LibTorch. Each Block is one layer of the Sequential, so a pipeline cuts between blocks.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>

namespace gpipe {
namespace models {

struct CharGPTOptions {
  /// Tokens are bytes.
  TORCH_ARG(int64_t, vocab_size) = 256;
  /// The longest context, in tokens.
  TORCH_ARG(int64_t, block_size) = 64;
  TORCH_ARG(int64_t, embedding_dim) = 128;
  /// Must divide embedding_dim.
  TORCH_ARG(int64_t, num_heads) = 4;
  /// Transformer blocks; the Sequential has num_layers + 2 layers.
  TORCH_ARG(int64_t, num_layers) = 4;
  TORCH_ARG(double, dropout) = 0.0;
  /// The head's projection is the token embedding's weight; otherwise a Linear of its own.
  TORCH_ARG(bool, tie_embeddings) = true;
};

/// The model; its layers take and return one tensor. Throws c10::ValueError for a non-positive
/// size or num_heads not dividing embedding_dim.
torch::nn::Sequential char_gpt(const CharGPTOptions& options = {});

/// The mean cross-entropy of `logits` [B, T, V] against `targets` [B, T] (token ids).
at::Tensor char_gpt_loss(const at::Tensor& logits, const at::Tensor& targets);

/// Continues `prompt` by `length` bytes sampled from `model` at `temperature` (> 0), with
/// `generator` (may be undefined: the default generator). Runs in eval mode without gradients
/// and restores the model's mode. An empty prompt starts from a newline.
std::string sample(torch::nn::Sequential& model, const CharGPTOptions& options,
                   const std::string& prompt, int64_t length, double temperature,
                   at::Generator generator = {});

}  // namespace models
}  // namespace gpipe
