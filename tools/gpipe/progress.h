// The progress line of `gpipe train`: step, loss, samples/s and ETA, redrawn in place on a
// terminal and printed every tenth of the run otherwise (logs stay short).
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace gpipe {
namespace cli {

class ProgressBar {
 public:
  /// `total` steps of `samples_per_step` samples, starting at step `first` (after a resume);
  /// `interactive`: redraw one line with '\r'.
  ProgressBar(std::ostream& out, int64_t total, int64_t samples_per_step, bool interactive,
              int64_t first = 1);

  /// Step `step` (1-based) is done with `loss`.
  void update(int64_t step, double loss);

  /// Prints `line` on a line of its own (e.g. a validation loss); the progress line goes on
  /// below it.
  void note(const std::string& line);

  /// Ends the line.
  void finish();

 private:
  std::ostream& out_;
  int64_t total_;
  int64_t samples_per_step_;
  bool interactive_;
  int64_t first_;
  std::chrono::steady_clock::time_point start_;
  double smoothed_loss_ = 0;
  int64_t last_printed_ = 0;
};

}  // namespace cli
}  // namespace gpipe
