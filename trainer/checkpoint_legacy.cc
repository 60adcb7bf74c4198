// The legacy checkpoint format, written synchronously: named blobs in one
// ckpt-<batch>.tck with a length and a CRC-32. To be removed once the training
// loop writes through CheckpointWriter (checkpoint.h).
#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tandem::trainer {
namespace {

namespace fs = std::filesystem;
constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = 8 + 4 + 8 + 4;  // magic, version, payload length, crc32

void put64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
void put32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
template <class T>
T get(const std::string& s, size_t& at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof v);
  at += sizeof v;
  return v;
}

[[noreturn]] void sys_fail(const std::string& what, const std::string& path) {
  throw std::runtime_error(what + " '" + path + "': " + std::strerror(errno));
}

void write_fd(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) sys_fail("cannot write checkpoint", path);
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void write_checkpoint(const std::string& path, const Blobs& blobs) {
  std::string payload;
  put32(payload, static_cast<uint32_t>(blobs.size()));
  for (const auto& [name, data] : blobs) {
    put32(payload, static_cast<uint32_t>(name.size()));
    payload += name;
    put64(payload, data.size());
    payload += data;
  }
  std::string file(kMagic, 8);
  put32(file, kVersion);
  put64(file, payload.size());
  put32(file, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(payload.data()), static_cast<uInt>(payload.size()))));
  file += payload;

  const fs::path final_path(path);
  const fs::path dir = final_path.has_parent_path() ? final_path.parent_path() : fs::path(".");
  const std::string tmp = (dir / ("." + final_path.filename().string() + ".tmp")).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) sys_fail("cannot create", tmp);
  try {
    write_fd(fd, file, tmp);
    if (::fsync(fd) != 0) sys_fail("cannot fsync", tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) sys_fail("cannot rename checkpoint to", path);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

Blobs read_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CorruptCheckpoint("cannot read checkpoint '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string file = ss.str();
  auto bad = [&](const std::string& why) { return CorruptCheckpoint("checkpoint '" + path + "' rejected: " + why); };
  if (file.size() < kHeader || std::memcmp(file.data(), kMagic, 8) != 0) throw bad("not a tandem checkpoint (bad magic)");
  size_t at = 8;
  if (get<uint32_t>(file, at) != kVersion) throw bad("unknown format version");
  const uint64_t length = get<uint64_t>(file, at);
  const uint32_t crc = get<uint32_t>(file, at);
  if (file.size() - kHeader != length)
    throw bad("torn: " + std::to_string(file.size() - kHeader) + " payload bytes, header says " + std::to_string(length));
  if (crc32(0, reinterpret_cast<const Bytef*>(file.data() + kHeader), static_cast<uInt>(length)) != crc)
    throw bad("checksum mismatch (torn or overwritten)");
  Blobs blobs;
  const uint32_t count = get<uint32_t>(file, at);
  for (uint32_t i = 0; i < count; ++i) {
    if (at + 4 > file.size()) throw bad("entry table overruns the file");
    const uint32_t name_len = get<uint32_t>(file, at);
    if (at + name_len + 8 > file.size()) throw bad("entry table overruns the file");
    std::string name = file.substr(at, name_len);
    at += name_len;
    const uint64_t len = get<uint64_t>(file, at);
    if (at + len > file.size()) throw bad("entry '" + name + "' overruns the file");
    blobs[name] = file.substr(at, len);
    at += len;
  }
  return blobs;
}

std::string checkpoint_path(const std::string& dir, int64_t batch) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-%012lld.tck", static_cast<long long>(batch));
  return (fs::path(dir) / name).string();
}

namespace {
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() == 21 && name.starts_with("ckpt-") && name.ends_with(".tck"))
      out.emplace_back(std::stoll(name.substr(5, 12)), e.path().string());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}
}  // namespace

void prune_checkpoints(const std::string& dir, size_t keep) {
  auto all = list_checkpoints(dir);
  for (size_t i = keep; i < all.size(); ++i) fs::remove(all[i].second);
}

}  // namespace tandem::trainer
