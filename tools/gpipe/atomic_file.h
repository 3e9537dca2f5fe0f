// Files that are either whole or absent: written beside their place, flushed to disk, then
// renamed over it, so that a crash or a failed write leaves what was there before.
#pragma once

#include <functional>
#include <string>

namespace gpipe {
namespace cli {

/// Calls `write(temporary)` to write the file at a temporary path beside `path` (`path`.partial),
/// flushes it and its folder to disk and renames it to `path`. Throws what `write` throws, or
/// std::runtime_error naming the file; the temporary file is removed and `path` is unchanged.
void write_atomically(const std::string& path,
                      const std::function<void(const std::string& temporary)>& write);

/// Writes `text` to `path` with write_atomically().
void write_text_atomically(const std::string& path, const std::string& text);

}  // namespace cli
}  // namespace gpipe
