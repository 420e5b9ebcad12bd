// Durable files: what checkpoints and HF exports need to survive a crash (write, fsync the file,
// rename into place, fsync the directory).
#pragma once

#include <filesystem>
#include <string>

namespace dt::io {

// fsync of a file (dir false) or of a directory's entries (dir true): "" or the error naming the
// path and the reason.
std::string fsync_path(const std::filesystem::path& p, bool dir);

}  // namespace dt::io
