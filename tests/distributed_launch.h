// Starting the worker (distributed_worker.cpp) on several ranks under gpipe_launch, for the
// multi-process tests. GPIPE_LAUNCH and GPIPE_DISTRIBUTED_WORKER come from tests/CMakeLists.txt.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace gpipe {
namespace testing {

struct Launch {
  int exit_code = -1;
  double seconds = 0;  // wall time of the whole job
  std::string output;  // stdout and stderr of the launcher and every rank
  std::string dir;     // where the ranks wrote their files
};

// A fresh directory under $TMPDIR (or /tmp).
inline std::string make_temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp ? tmp : "/tmp") + "/gpipe_distributed_XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  const char* dir = mkdtemp(buffer.data());
  return dir ? std::string(dir) : std::string();
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `ranks` workers with `args` (plus --out) under the launcher, which gives the others
// `grace` seconds after one fails.
inline Launch launch_workers(int ranks, const std::string& args, int grace = 30) {
  Launch launch;
  launch.dir = make_temp_dir();
  const std::string command = std::string(GPIPE_LAUNCH) + " -n " + std::to_string(ranks) +
                              " --grace " + std::to_string(grace) + " -- " +
                              GPIPE_DISTRIBUTED_WORKER + " --out " + launch.dir + " " + args +
                              " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return launch;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) launch.output.append(buffer, n);
  const int status = pclose(pipe);
  launch.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  launch.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return launch;
}

}  // namespace testing
}  // namespace gpipe
