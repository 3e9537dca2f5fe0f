#include <gpipe/gpipe.h>
#include <torch/torch.h>

int main() {
  torch::nn::Sequential sequential(
      torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64), torch::nn::ReLU(),
      torch::nn::Linear(64, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
  // Two partitions of 4 and 3 layers, each batch split into 8 micro-batches.
  gpipe::GPipe model(sequential, gpipe::GPipeOptions({4, 3}).chunks(8));
  torch::optim::SGD optimizer(model->parameters(), /*lr=*/0.1);

  auto input = torch::randn({64, 16});
  auto target = torch::randint(0, 4, {64});
  for (int step = 0; step < 5; ++step) {
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model->forward(input), target);
    loss.backward();  // plain autograd: the pipeline is transparent
    optimizer.step();
    std::cout << "step " << step << " loss " << loss.item<float>() << "\n";
  }
}
