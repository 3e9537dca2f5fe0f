#include "gpipe/microbatch.h"

#include <ATen/ops/cat.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <algorithm>

namespace gpipe {

Batch::Batch(at::Tensor tensor) : values_{std::move(tensor)}, atomic_(true) {}

Batch::Batch(std::vector<at::Tensor> tensors) : values_(std::move(tensors)), atomic_(false) {}

const at::Tensor& Batch::tensor() const {
  TORCH_CHECK_TYPE(atomic_, "not an atomic batch (it holds a list of ", values_.size(),
                   " tensors)");
  return values_[0];
}

at::Tensor& Batch::operator[](size_t index) {
  TORCH_CHECK_INDEX(!atomic_ || index == 0, "atomic batch allows index 0 only (index: ", index,
                    ")");
  TORCH_CHECK_INDEX(index < values_.size(), "index ", index, " is out of range for a batch of ",
                    values_.size(), " tensors");
  return values_[index];
}

const at::Tensor& Batch::operator[](size_t index) const { return const_cast<Batch&>(*this)[index]; }

void Batch::set_tensors(std::vector<at::Tensor> tensors) {
  TORCH_CHECK_INDEX(!atomic_ || tensors.size() == 1,
                    "atomic batch cannot be replaced with multiple tensors (got ", tensors.size(),
                    ")");
  values_ = std::move(tensors);
}

Batch Batch::call(torch::nn::Sequential& sequential, const std::string& what) const {
  TORCH_CHECK_VALUE(!sequential->is_empty(), "cannot call ", what, ": it has no layers");
  auto layer = sequential->begin();
  torch::nn::AnyValue value =
      atomic_ ? layer->any_forward(values_[0]) : layer->any_forward(values_);
  for (++layer; layer != sequential->end(); ++layer) value = layer->any_forward(std::move(value));
  return from_value(std::move(value), what);
}

Batch Batch::from_value(torch::nn::AnyValue&& value, const std::string& what) {
  if (auto* tensor = value.try_get<at::Tensor>()) return Batch(std::move(*tensor));
  if (auto* tensors = value.try_get<std::vector<at::Tensor>>()) return Batch(std::move(*tensors));
  TORCH_CHECK_TYPE(false, "expected Tensor or std::vector<Tensor>, but got ",
                   c10::demangle(value.type_info().name()), " from ", what);
}

void check(const Batch& input) {
  TORCH_CHECK_VALUE(input.size() > 0, "expected at least one tensor in the input, but got none");
  for (const auto i : c10::irange(input.size())) {
    const at::Tensor& x = input.tensors()[i];
    TORCH_CHECK_VALUE(x.defined(), "input tensor ", i, " is undefined");
    TORCH_CHECK_VALUE(x.dim() > 0, "input tensor ", i, " is 0-dimensional (shape ", x.sizes(),
                      "), but micro-batches are split along dim 0");
    const at::Tensor& first = input.tensors()[0];
    TORCH_CHECK_VALUE(x.size(0) == first.size(0),
                      "all input tensors must have the same batch size (dim 0), but tensor 0 has ",
                      first.size(0), " and tensor ", i, " has ", x.size(0));
  }
}

namespace {

// torch.chunk makes at most one chunk per sample: asking for no more is the same, and keeps
// ATen's size + chunks - 1 from overflowing when chunks is huge.
std::vector<at::Tensor> chunk_by_samples(const at::Tensor& tensor, int64_t chunks) {
  if (tensor.dim() > 0) chunks = std::min(chunks, std::max<int64_t>(tensor.size(0), 1));
  return tensor.chunk(chunks);
}

}  // namespace

std::vector<Batch> scatter(const Batch& input, int64_t chunks) {
  TORCH_INTERNAL_ASSERT(chunks > 0);
  if (input.atomic()) {
    std::vector<Batch> batches;
    for (auto& piece : chunk_by_samples(input.tensor(), chunks)) {
      batches.emplace_back(std::move(piece));
    }
    return batches;
  }
  // Chunk each tensor, then zip: micro-batch k holds chunk k of every tensor.
  std::vector<std::vector<at::Tensor>> zipped;
  for (const auto& tensor : input) {
    auto chunked = chunk_by_samples(tensor, chunks);
    zipped.resize(chunked.size());
    for (const auto k : c10::irange(chunked.size())) zipped[k].push_back(std::move(chunked[k]));
  }
  return std::vector<Batch>(zipped.begin(), zipped.end());
}

Batch gather(const std::vector<Batch>& outputs) {
  TORCH_INTERNAL_ASSERT(!outputs.empty());
  const Batch& first = outputs[0];
  auto describe = [](const Batch& b) {
    return b.atomic() ? std::string("a Tensor")
                      : "a list of " + std::to_string(b.size()) + " tensors";
  };
  for (const auto k : c10::irange(outputs.size())) {
    TORCH_CHECK_TYPE(outputs[k].atomic() == first.atomic() && outputs[k].size() == first.size(),
                     "micro-batch outputs differ in structure: micro-batch 0 gave ",
                     describe(first), " but micro-batch ", k, " gave ", describe(outputs[k]));
  }
  if (outputs.size() == 1) return first;
  std::vector<at::Tensor> gathered;
  for (const auto position : c10::irange(first.size())) {
    std::vector<at::Tensor> parts;
    parts.reserve(outputs.size());
    for (const auto& output : outputs) parts.push_back(output.tensors()[position]);
    gathered.push_back(at::cat(parts));
  }
  if (first.atomic()) return Batch(std::move(gathered[0]));
  return Batch(std::move(gathered));
}

}  // namespace gpipe
