// A Python process that answers requests one at a time: JSON lines to its stdin, one JSON line
// back per request on its stdout. gpu_pipeline keeps torchgpipe_side.py running in one, so its
// rounds can alternate between gpipe (here) and torchgpipe (there) with both models warm.
#pragma once

#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>

namespace gpipe {
namespace bench {

class PythonPeer {
 public:
  /// Starts `python script` (`python` a path, or a name looked up in PATH); its stderr is ours.
  PythonPeer(const std::string& python, const std::string& script) {
    signal(SIGPIPE, SIG_IGN);  // a peer that died is an error from request(), not our death
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dup2(to_child[0], STDIN_FILENO);
      dup2(from_child[1], STDOUT_FILENO);
      for (const int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) close(fd);
      execlp(python.c_str(), python.c_str(), "-u", script.c_str(), static_cast<char*>(nullptr));
      std::fprintf(stderr, "cannot run %s\n", python.c_str());
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    to_ = fdopen(to_child[1], "w");
    from_ = fdopen(from_child[0], "r");
  }
  PythonPeer(const PythonPeer&) = delete;
  PythonPeer& operator=(const PythonPeer&) = delete;

  /// Closing its stdin ends the peer's loop.
  ~PythonPeer() {
    std::fclose(to_);
    std::fclose(from_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

  /// Sends one request and returns the reply. Throws std::runtime_error with the peer's message
  /// where it answers {"error": ...}, and where it exits without answering.
  nlohmann::json request(const nlohmann::json& message) {
    const std::string line = message.dump() + "\n";
    std::string reply;
    if (std::fputs(line.c_str(), to_) >= 0 && std::fflush(to_) == 0) {
      for (int c; (c = std::fgetc(from_)) != EOF && c != '\n';) reply += static_cast<char>(c);
    }
    if (reply.empty()) {
      throw std::runtime_error("the Python peer exited without answering " + message.dump());
    }
    nlohmann::json answer = nlohmann::json::parse(reply);
    if (answer.contains("error")) {
      throw std::runtime_error("the Python peer failed: " + answer["error"].get<std::string>());
    }
    return answer;
  }

 private:
  pid_t pid_ = -1;
  std::FILE* to_ = nullptr;
  std::FILE* from_ = nullptr;
};

}  // namespace bench
}  // namespace gpipe
