#include "deltatron/io/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "deltatron/ops/basic.h"

namespace dt::io {

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::u16: return "U16";
  }
  return "?";
}

bool parse_safetensors_dtype(const std::string& s, DType* out) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8, DType::u16})
    if (s == safetensors_dtype_name(t)) {
      *out = t;
      return true;
    }
  return false;
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  auto it = tensors.find(name);
  DT_CHECK(it != tensors.end(), "{}: no tensor named '{}' ({} tensors in the file)", path, name, tensors.size());
  return it->second;
}

std::string read_safetensors(const std::string& path, SafetensorsFile* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return fmt::format("{}: cannot open ({})", path, std::strerror(errno));
  f.seekg(0, std::ios::end);
  const uint64_t size = uint64_t(f.tellg());
  f.seekg(0);
  if (size < 8) return fmt::format("{}: truncated: {} bytes, a safetensors file starts with an 8-byte header length", path, size);
  uint64_t hlen = 0;
  unsigned char lenb[8];
  f.read(reinterpret_cast<char*>(lenb), 8);
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | lenb[i];
  if (hlen > size - 8)
    return fmt::format("{}: header length {} exceeds the file size {} (truncated or not safetensors)", path, hlen, size);
  std::string header(hlen, '\0');
  f.read(header.data(), std::streamsize(hlen));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    return fmt::format("{}: header is not valid JSON: {}", path, e.what());
  }
  if (!j.is_object()) return fmt::format("{}: header is not a JSON object", path);
  const uint64_t data_begin = 8 + hlen, data_size = size - data_begin;
  out->path = path;
  out->tensors.clear();
  out->metadata.clear();
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) return fmt::format("{}: __metadata__ is not an object", path);
      for (auto m = it->begin(); m != it->end(); ++m)
        if (m->is_string()) out->metadata[m.key()] = m->get<std::string>();
      continue;
    }
    const nlohmann::json& e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      return fmt::format("{}: tensor '{}': entry needs dtype, shape and data_offsets", path, name);
    DType t;
    if (!e["dtype"].is_string() || !parse_safetensors_dtype(e["dtype"].get<std::string>(), &t))
      return fmt::format("{}: tensor '{}': unsupported dtype {}", path, name, e["dtype"].dump());
    Shape s;
    if (!e["shape"].is_array() || e["shape"].size() > size_t(kMaxDims))
      return fmt::format("{}: tensor '{}': shape {} is not an array of at most {} dims", path, name, e["shape"].dump(),
                         kMaxDims);
    for (const auto& d : e["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return fmt::format("{}: tensor '{}': bad dimension {}", path, name, d.dump());
      s.d[s.ndim++] = d.get<int64_t>();
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return fmt::format("{}: tensor '{}': data_offsets {} must be two non-negative integers", path, name, off.dump());
    uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    uint64_t want = uint64_t(s.numel()) * dtype_size(t);
    if (en < b || en > data_size)
      return fmt::format("{}: tensor '{}': data_offsets [{}, {}) outside the {} data bytes (truncated file?)", path,
                         name, b, en, data_size);
    if (en - b != want)
      return fmt::format("{}: tensor '{}': {} bytes for shape {} {} needs {}", path, name, en - b, s.str(),
                         dtype_name(t), want);
    ranges.push_back({b, en});
    Tensor tt = Tensor::empty(s, t);
    f.seekg(std::streamoff(data_begin + b));
    if (want && !f.read(static_cast<char*>(tt.data()), std::streamsize(want)))
      return fmt::format("{}: tensor '{}': read failed", path, name);
    out->tensors.emplace(name, std::move(tt));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) return fmt::format("{}: tensor data ranges overlap", path);
  return "";
}

SafetensorsFile read_safetensors_or_die(const std::string& path) {
  SafetensorsFile f;
  std::string err = read_safetensors(path, &f);
  if (!err.empty()) user_error(err, false);
  return f;
}

std::string write_safetensors(const std::string& path, const std::map<std::string, TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json j = nlohmann::json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t off = 0;
  std::vector<Tensor> host;
  for (const auto& [name, v] : tensors) {
    Tensor h = Tensor::empty(v.shape, v.dtype);
    Tensor src = v.device.is_cpu() ? Tensor() : ops::to_host(v);
    ops::copy(h, v.device.is_cpu() ? v : src.view());
    std::vector<int64_t> shape(v.shape.d.begin(), v.shape.d.begin() + v.shape.ndim);
    j[name] = {{"dtype", safetensors_dtype_name(v.dtype)}, {"shape", shape}, {"data_offsets", {off, off + h.nbytes()}}};
    off += h.nbytes();
    host.push_back(std::move(h));
  }
  std::string header = j.dump();
  while ((header.size() + 8) % 8) header += ' ';  // align the data to 8 bytes
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return fmt::format("{}: cannot create ({})", path, std::strerror(errno));
  uint64_t hlen = header.size();
  unsigned char lenb[8];
  for (int i = 0; i < 8; ++i) lenb[i] = (hlen >> (8 * i)) & 0xff;
  f.write(reinterpret_cast<const char*>(lenb), 8);
  f.write(header.data(), std::streamsize(header.size()));
  for (const Tensor& h : host) f.write(static_cast<const char*>(h.data()), std::streamsize(h.nbytes()));
  // close() flushes the buffered tail, so a full disk may show only here; errno says which failure.
  const bool wrote = bool(f);
  f.close();
  if (!wrote || !f)
    return fmt::format("{}: write failed ({}); {} bytes were to be written", path, std::strerror(errno),
                       8 + header.size() + off);
  return "";
}

}  // namespace dt::io
