#include "models/char_gpt.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <cmath>

namespace gpipe {
namespace models {
namespace {

// Token and position embeddings: bytes [B, T] -> [B, T, C]. Drawn from N(0, 0.02) as GPT-2's:
// the token embedding is also the head's projection, whose logits would start far from uniform
// with LibTorch's N(0, 1).
struct EmbeddingImpl : torch::nn::Module {
  explicit EmbeddingImpl(const CharGPTOptions& o)
      : tokens(register_module("tokens", torch::nn::Embedding(o.vocab_size(), o.embedding_dim()))),
        positions(
            register_module("positions", torch::nn::Embedding(o.block_size(), o.embedding_dim()))),
        dropout(register_module("dropout", torch::nn::Dropout(o.dropout()))) {}

  torch::Tensor forward(const torch::Tensor& bytes) {
    const auto where = torch::arange(bytes.size(1), bytes.options().dtype(torch::kLong));
    return dropout(tokens(bytes) + positions(where));
  }

  torch::nn::Embedding tokens;
  torch::nn::Embedding positions;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(Embedding);

// Causal multi-head self-attention.
struct SelfAttentionImpl : torch::nn::Module {
  explicit SelfAttentionImpl(const CharGPTOptions& o)
      : heads(o.num_heads()),
        qkv(register_module("qkv", torch::nn::Linear(o.embedding_dim(), 3 * o.embedding_dim()))),
        projection(
            register_module("projection", torch::nn::Linear(o.embedding_dim(), o.embedding_dim()))),
        dropout(register_module("dropout", torch::nn::Dropout(o.dropout()))) {
    // Not a parameter: a buffer, so it moves with the module and is saved with it.
    mask = register_buffer("mask", torch::ones({o.block_size(), o.block_size()}).tril());
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), D = C / heads;
    auto parts = qkv(x).split(C, /*dim=*/2);
    const auto per_head = [&](const torch::Tensor& t) {
      return t.view({B, T, heads, D}).transpose(1, 2);  // [B, H, T, D]
    };
    auto q = per_head(parts[0]), k = per_head(parts[1]), v = per_head(parts[2]);
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(D));
    scores = scores.masked_fill(mask.slice(0, 0, T).slice(1, 0, T) == 0,
                                -std::numeric_limits<float>::infinity());
    auto y = torch::matmul(dropout(torch::softmax(scores, -1)), v);
    return dropout(projection(y.transpose(1, 2).contiguous().view({B, T, C})));
  }

  int64_t heads;
  torch::nn::Linear qkv;
  torch::nn::Linear projection;
  torch::nn::Dropout dropout;
  torch::Tensor mask;
};
TORCH_MODULE(SelfAttention);

// A pre-norm transformer layer.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const CharGPTOptions& o)
      : norm1(register_module(
            "norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.embedding_dim()})))),
        attention(register_module("attention", SelfAttention(o))),
        norm2(register_module(
            "norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.embedding_dim()})))),
        mlp(register_module("mlp", torch::nn::Sequential(
                                       torch::nn::Linear(o.embedding_dim(), 4 * o.embedding_dim()),
                                       torch::nn::GELU(),
                                       torch::nn::Linear(4 * o.embedding_dim(), o.embedding_dim()),
                                       torch::nn::Dropout(o.dropout())))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = x + attention(norm1(x));
    return x + mlp->forward(norm2(x));
  }

  torch::nn::LayerNorm norm1;
  SelfAttention attention;
  torch::nn::LayerNorm norm2;
  torch::nn::Sequential mlp;
};
TORCH_MODULE(Block);

// Final norm and the projection to byte logits: with `tied`, the token embedding's weight,
// registered here too (the same tensor), and a bias of its own; its input is scaled by
// 1/sqrt(width), as T5 does when it ties, so that logits start near uniform with the embedding's
// N(0, 1) weights.
struct HeadImpl : torch::nn::Module {
  HeadImpl(const CharGPTOptions& o, const torch::Tensor& tied)
      : norm(register_module(
            "norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.embedding_dim()})))) {
    if (tied.defined()) {
      scale = 1.0 / std::sqrt(static_cast<double>(o.embedding_dim()));
      weight = register_parameter("weight", tied);
      bias = register_parameter("bias", torch::zeros({o.vocab_size()}));
    } else {
      logits = register_module("logits", torch::nn::Linear(o.embedding_dim(), o.vocab_size()));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    if (logits) return logits(norm(x));
    return torch::nn::functional::linear(norm(x) * scale, weight, bias);
  }

  torch::nn::LayerNorm norm;
  torch::nn::Linear logits{nullptr};
  torch::Tensor weight;
  torch::Tensor bias;
  double scale = 1.0;
};
TORCH_MODULE(Head);

}  // namespace

torch::nn::Sequential char_gpt(const CharGPTOptions& o) {
  TORCH_CHECK_VALUE(o.vocab_size() > 0 && o.block_size() > 0 && o.embedding_dim() > 0 &&
                        o.num_heads() > 0 && o.num_layers() > 0,
                    "char GPT sizes must be positive (vocab_size ", o.vocab_size(), ", block_size ",
                    o.block_size(), ", embedding_dim ", o.embedding_dim(), ", num_heads ",
                    o.num_heads(), ", num_layers ", o.num_layers(), ")");
  TORCH_CHECK_VALUE(o.embedding_dim() % o.num_heads() == 0, "num_heads (", o.num_heads(),
                    ") must divide embedding_dim (", o.embedding_dim(), ")");
  TORCH_CHECK_VALUE(o.dropout() >= 0 && o.dropout() < 1, "dropout must be in [0, 1), but got ",
                    o.dropout());
  torch::nn::Sequential model;
  Embedding embedding(o);
  model->push_back("embedding", embedding);
  for (int64_t k = 0; k < o.num_layers(); ++k) {
    model->push_back("block" + std::to_string(k), Block(o));
  }
  model->push_back("head",
                   Head(o, o.tie_embeddings() ? embedding->tokens->weight : torch::Tensor()));
  return model;
}

at::Tensor char_gpt_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}).to(logits.device()));
}

std::string sample(torch::nn::Sequential& model, const CharGPTOptions& options,
                   const std::string& prompt, int64_t length, double temperature,
                   at::Generator generator) {
  TORCH_CHECK_VALUE(temperature > 0, "temperature must be positive, but got ", temperature);
  TORCH_CHECK_VALUE(length >= 0, "length must be non-negative, but got ", length);
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  const auto device = model->parameters().front().device();

  std::vector<int64_t> tokens;
  for (const unsigned char c : prompt.empty() ? std::string("\n") : prompt) tokens.push_back(c);
  std::string text;
  for (int64_t n = 0; n < length; ++n) {
    const auto begin = static_cast<int64_t>(tokens.size()) > options.block_size()
                           ? tokens.end() - options.block_size()
                           : tokens.begin();
    const auto context =
        torch::tensor(std::vector<int64_t>(begin, tokens.end()), torch::kLong).unsqueeze(0);
    const auto logits = model->forward(context.to(device)).select(1, -1).squeeze(0);
    const auto probabilities = torch::softmax(logits.to(torch::kDouble) / temperature, -1).cpu();
    const int64_t next =
        torch::multinomial(probabilities, 1, /*replacement=*/false, generator).item<int64_t>();
    tokens.push_back(next);
    text += static_cast<char>(static_cast<unsigned char>(next));
  }
  model->train(was_training);
  return text;
}

}  // namespace models
}  // namespace gpipe
