#include "progress.h"

#include <cstdio>
#include <string>

namespace gpipe {
namespace cli {
namespace {

std::string clock_time(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%lld:%02lld", static_cast<long long>(s / 60),
                static_cast<long long>(s % 60));
  return buffer;
}

}  // namespace

ProgressBar::ProgressBar(std::ostream& out, int64_t total, int64_t samples_per_step,
                         bool interactive, int64_t first)
    : out_(out),
      total_(total),
      samples_per_step_(samples_per_step),
      interactive_(interactive),
      first_(first),
      start_(std::chrono::steady_clock::now()) {}

void ProgressBar::update(int64_t step, double loss) {
  // An exponential average: single-batch losses jump around.
  smoothed_loss_ = step == first_ ? loss : 0.9 * smoothed_loss_ + 0.1 * loss;
  const bool due = interactive_ ? true : step == total_ || step * 10 / total_ > last_printed_;
  if (!due) return;
  last_printed_ = step * 10 / total_;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t done = step - first_ + 1;  // by this run
  const double rate = elapsed > 0 ? static_cast<double>(done * samples_per_step_) / elapsed : 0;
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * (total_ - step) : 0;
  constexpr int kWidth = 24;
  const auto filled = static_cast<int>(kWidth * step / total_);
  char line[160];
  std::snprintf(line, sizeof(line), "step %lld/%lld [%s%s] loss %.4f | %.0f samples/s | ETA %s",
                static_cast<long long>(step), static_cast<long long>(total_),
                std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                smoothed_loss_, rate, clock_time(eta).c_str());
  if (interactive_) {
    out_ << '\r' << line << "\x1b[K" << std::flush;
  } else {
    out_ << line << '\n' << std::flush;
  }
}

void ProgressBar::note(const std::string& line) {
  if (interactive_) out_ << '\r' << "\x1b[K";
  out_ << line << '\n' << std::flush;
}

void ProgressBar::finish() {
  if (interactive_) out_ << '\n' << std::flush;
}

}  // namespace cli
}  // namespace gpipe
