// Durable files: what checkpoints and HF exports need to survive a crash (write, fsync the file,
// rename into place, fsync the directory).
#pragma once

#include <filesystem>
#include <string>

namespace dt::io {

// fsync of a file (dir false) or of a directory's entries (dir true): "" or the error naming the
// path and the reason.
std::string fsync_path(const std::filesystem::path& p, bool dir);
// `content` into p (created or truncated), then fsynced: "" or the error naming the path.
std::string write_durable(const std::filesystem::path& p, const std::string& content);

}  // namespace dt::io
