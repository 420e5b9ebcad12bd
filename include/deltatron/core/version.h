#pragma once
namespace dt {
const char* version();   // "0.1.0"
const char* git_hash();  // short hash at configure time, or "unknown"
}  // namespace dt
