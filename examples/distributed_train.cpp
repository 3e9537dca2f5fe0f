// Trains a small model pipelined over processes, one stage per rank:
//   build/gpipe_launch -n 2 -- build/examples/distributed_train
//   torchrun --nproc-per-node 2 --no-python build/examples/distributed_train
#include <gpipe/distributed/pipeline_stage.h>
#include <torch/torch.h>

#include <iostream>

int main() {
  namespace gd = gpipe::distributed;
  torch::manual_seed(0);  // every rank builds the same model, then keeps its own stages
  torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 64), torch::nn::ReLU(),
                              torch::nn::Linear(64, 1));
  try {
    gd::PipelineStage pipe(
        model, /*balance=*/{2, 3},
        [](const gpipe::Batch& output, const gpipe::Batch& target) {
          return torch::mse_loss(output.tensor(), target.tensor());
        },
        gd::PipelineStageOptions(/*chunks=*/4).timeout(std::chrono::seconds(30)));
    torch::optim::SGD optimizer(pipe.parameters(), /*lr=*/0.05);  // this rank's, each once
    const torch::Tensor input = torch::randn({64, 16});           // the same batch on every rank
    const torch::Tensor target = input.sum(1, /*keepdim=*/true).sin();
    for (int step = 0; step < 20; ++step) {
      optimizer.zero_grad();
      const torch::Tensor loss = pipe.step(input, target);  // on every rank
      optimizer.step();
      if (pipe.rank() == 0 && step % 5 == 4) {
        std::cout << "step " << step + 1 << ": loss " << loss.item<double>() << std::endl;
      }
    }
  } catch (const c10::Error& error) {  // destroys `pipe` first: see pipeline_stage.h
    std::cerr << error.what_without_backtrace() << std::endl;
    return 1;
  }
  return 0;
}
