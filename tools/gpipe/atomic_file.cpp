#include "atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace gpipe {
namespace cli {
namespace {

// fsync of a file or a folder: a rename is durable only once the folder is on disk too.
void flush_to_disk(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string reason = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot flush '" + path + "' to disk: " + reason);
  }
  ::close(fd);
}

}  // namespace

void write_atomically(const std::string& path,
                      const std::function<void(const std::string& temporary)>& write) {
  const std::string partial = path + ".partial";
  try {
    write(partial);
    flush_to_disk(partial);
    std::filesystem::rename(partial, path);
    const auto folder = std::filesystem::path(path).parent_path();
    flush_to_disk(folder.empty() ? "." : folder.string());
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw;
  }
}

void write_text_atomically(const std::string& path, const std::string& text) {
  write_atomically(path, [&](const std::string& temporary) {
    std::ofstream out(temporary, std::ios::binary);
    out << text;
    out.close();
    if (!out) throw std::runtime_error("cannot write '" + temporary + "'");
  });
}

}  // namespace cli
}  // namespace gpipe
