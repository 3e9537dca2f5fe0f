// Trains a classifier on a synthetic two-spirals data set, pipelined over partitions with GPipe,
// and prints the loss, accuracy and time as it goes.
//
//   train_pipeline [--steps N] [--partitions P] [--chunks M] [--checkpoint
//   always|except_last|never]
#include <gpipe/gpipe.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <string>

namespace {

// Two interleaved spirals in the plane, one per class: not linearly separable.
std::pair<torch::Tensor, torch::Tensor> two_spirals(int64_t n, torch::Generator generator) {
  auto t = torch::rand({n}, generator) * 3 * M_PI + 0.5;
  auto label = torch::randint(0, 2, {n}, generator);
  auto sign = label.to(torch::kFloat) * 2 - 1;
  auto x = torch::stack({t * torch::cos(t) * sign, t * torch::sin(t) * sign}, 1) / 10;
  return {x + 0.02 * torch::randn({n, 2}, generator), label};
}

// An MLP whose hidden layers (Linear + ReLU pairs) are spread over `partitions` partitions.
std::pair<torch::nn::Sequential, std::vector<int64_t>> make_model(int64_t partitions) {
  const int64_t hidden = 64, blocks = 2 * partitions;
  torch::nn::Sequential model(torch::nn::Linear(2, hidden), torch::nn::ReLU());
  for (int64_t b = 1; b < blocks; ++b) {
    model->push_back(torch::nn::Linear(hidden, hidden));
    model->push_back(torch::nn::ReLU());
  }
  model->push_back(torch::nn::Linear(hidden, 2));
  std::vector<int64_t> balance(partitions, 4);  // 2 blocks (4 layers) each...
  balance.back() += 1;                          // ...and the output layer on the last
  return {model, balance};
}

int64_t parse_positive(const std::string& flag, const char* value) {
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0' || parsed <= 0) {
    std::cerr << "train_pipeline: " << flag << " takes a positive integer, got '" << value << "'\n";
    std::exit(2);
  }
  return parsed;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 600, partitions = 4, chunks = 8;
  gpipe::CheckpointMode checkpoint = gpipe::CheckpointMode::kExceptLast;
  for (int k = 1; k < argc; ++k) {
    const std::string flag = argv[k];
    if (flag == "--help" || flag == "-h") {
      std::cout << "usage: train_pipeline [--steps N] [--partitions P] [--chunks M] "
                   "[--checkpoint always|except_last|never]\n";
      return 0;
    }
    if (k + 1 >= argc) {
      std::cerr << "train_pipeline: " << flag << " needs a value\n";
      return 2;
    }
    const char* value = argv[++k];
    try {
      if (flag == "--steps") {
        steps = parse_positive(flag, value);
      } else if (flag == "--partitions") {
        partitions = parse_positive(flag, value);
      } else if (flag == "--chunks") {
        chunks = parse_positive(flag, value);
      } else if (flag == "--checkpoint") {
        checkpoint = gpipe::parse_checkpoint_mode(value);
      } else {
        std::cerr << "train_pipeline: unknown flag " << flag << "\n";
        return 2;
      }
    } catch (const c10::Error& error) {
      std::cerr << "train_pipeline: " << error.what_without_backtrace() << "\n";
      return 2;
    }
  }

  torch::manual_seed(0);
  auto generator = at::detail::createCPUGenerator(/*seed_in=*/1);
  auto [train_x, train_y] = two_spirals(4096, generator);
  auto [test_x, test_y] = two_spirals(1024, generator);

  auto [sequential, balance] = make_model(partitions);
  gpipe::GPipe model(sequential,
                     gpipe::GPipeOptions(balance).chunks(chunks).checkpoint(checkpoint));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(3e-3));
  model->pretty_print(std::cout);
  std::cout << " over " << partitions << " partitions, " << steps << " steps\n";

  const int64_t batch = 256;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= steps; ++step) {
    auto index = torch::randint(0, train_x.size(0), {batch}, generator);
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model->forward(train_x.index({index})),
                                                     train_y.index({index}));
    loss.backward();
    optimizer.step();
    if (step % 100 == 0 || step == 1 || step == steps) {
      torch::NoGradGuard no_grad;
      model->eval();
      const double accuracy =
          model->forward(test_x).argmax(1).eq(test_y).to(torch::kDouble).mean().item<double>();
      model->train();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::cout << "step " << std::setw(5) << step << "  loss " << std::fixed
                << std::setprecision(4) << loss.item<float>() << "  test accuracy "
                << std::setprecision(3) << accuracy << "  " << std::setprecision(2) << seconds
                << " s  (" << std::setprecision(0) << step * batch / seconds << " samples/s)\n";
    }
  }
}
