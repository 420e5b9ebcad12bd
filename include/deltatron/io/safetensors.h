// safetensors files: an 8-byte little-endian header length, a JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the raw little-endian tensor bytes. Used for HF checkpoints and test fixtures.
// Readers return errors as values naming the file and what is wrong (truncated, bad JSON,
// offsets out of range or overlapping, unknown dtype, shape/size mismatch).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "deltatron/core/tensor.h"

namespace dt::io {

struct SafetensorsFile {
  std::string path;
  std::map<std::string, Tensor> tensors;  // host tensors
  std::map<std::string, std::string> metadata;
  const Tensor& at(const std::string& name) const;  // aborts naming the file and the tensor when missing
};

// "" on success, else the error. On success `out` holds every tensor (host memory).
std::string read_safetensors(const std::string& path, SafetensorsFile* out);
SafetensorsFile read_safetensors_or_die(const std::string& path);

// Writes host or device tensors (copied to host) in name order, straight to `path` (callers that
// must not lose an older file write a temporary and rename it). "" on success, else the error
// with errno's reason, the final flush included.
std::string write_safetensors(const std::string& path, const std::map<std::string, TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// "F32", "BF16", "F16", "I32", "I64", "U8", "U16" <-> DType.
const char* safetensors_dtype_name(DType t);
bool parse_safetensors_dtype(const std::string& s, DType* out);

}  // namespace dt::io
