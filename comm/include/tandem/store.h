// Bootstrap key-value store: a small TCP server (Boost.Asio) and a client.
//
// Wire format, every frame in both directions (little-endian):
//   u32 magic 'TNDS' | u16 version | u16 opcode | u32 key bytes | u32 value bytes | key | value
// Keys are capped at kMaxKeyBytes and values at kMaxValueBytes; a frame that
// breaks the format (bad magic, version, opcode, oversized length) closes that
// one connection, and the server keeps serving every other client. A
// connection must send its first frame within StoreServerOptions::first_frame_timeout,
// and each started frame must complete within frame_timeout; a client that
// leaves a reply unread for frame_timeout is cut off too. The server's memory
// is bounded: max_connections (the oldest connection that has not yet
// identified itself makes room for a new one), max_data_bytes of stored keys
// and values, max_buffered_bytes of frames in transit, and at most
// max_wait_keys keys per wait or check.
//
// Ranks register with hello(rank); if such a connection drops without a
// goodbye(), the server records the rank under kFailedRanksKey so the others
// can fail fast with PeerFailure naming it. A rank that sends heartbeat(rank,
// interval) and then falls silent for kSilentHeartbeats intervals (stopped,
// hung, or cut off from the store) is recorded the same way. Why a rank was
// recorded is kept under failure_reason_key(rank).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/types.h"

namespace tandem {

inline constexpr uint32_t kStoreMagic = 0x53444E54;  // "TNDS"
inline constexpr uint16_t kStoreVersion = 1;
inline constexpr uint32_t kMaxKeyBytes = 4096;
inline constexpr uint32_t kMaxValueBytes = 64u << 20;
// Comma-separated ranks whose registered connection dropped without goodbye, in order of detection.
inline constexpr const char* kFailedRanksKey = "tandem/failed_ranks";
// The ranks of such a list, in order; items that are not numbers are skipped.
std::vector<int> parse_rank_list(const std::string& csv);
// Ranks as such a list ("0,2,3"); "" for none.
std::string format_rank_list(const std::vector<int>& ranks);
// A rank whose heartbeats stop for this many intervals is recorded as failed.
inline constexpr int kSilentHeartbeats = 2;
// Where the store keeps why a rank was recorded as failed (text).
inline std::string failure_reason_key(int rank) { return "tandem/failure/" + std::to_string(rank); }

// A fresh job secret: 32 random bytes (OpenSSL RAND_bytes) as 64 hex characters.
std::string new_job_secret();

struct StoreServerOptions {
  std::string host = "127.0.0.1";  // local runs never listen beyond loopback
  uint16_t port = 0;               // 0 picks a free port
  std::chrono::milliseconds first_frame_timeout{10000};
  std::chrono::milliseconds frame_timeout{10000};
  // The job secret (TANDEM_SECRET): when set, a connection must prove it knows
  // it (HMAC-SHA256 challenge-response) before anything else.
  std::string secret;
  // Resource caps (see the top of this file).
  size_t max_connections = 4096;
  size_t max_data_bytes = size_t{1} << 30;
  size_t max_buffered_bytes = size_t{256} << 20;
  size_t max_wait_keys = size_t{1} << 16;
};

// Runs its own I/O thread; stops and joins in the destructor.
class StoreServer {
 public:
  explicit StoreServer(StoreServerOptions options = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const;
  std::string address() const;  // "host:port"
  // Ranks recorded as failed so far (registered connection lost without goodbye).
  std::vector<int> failed_ranks() const;
  // Record a failure seen from outside (a launcher watching its children);
  // `reason` is kept under failure_reason_key(rank).
  void mark_failed(int rank, const std::string& reason = "reported failed by the launcher");

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The operations a communicator needs from a bootstrap key-value store, so
// that a store tandem did not write (c10d's, a test's in-memory one) can stand
// in for StoreClient. Keys and values are byte strings.
//
// Contract, every call: it returns or throws by `deadline` as far as the
// store allows (Timeout past it; PeerFailure(-1) when the store is gone;
// InvalidArgument for a request the store refuses). One handle serves one
// thread at a time; a second thread gets its own from connect_again().
//
// Liveness is optional. A store that tracks_liveness() (tandem's own,
// StoreClient) registers ranks with hello/goodbye/heartbeat and records a rank
// that drops or falls silent under kFailedRanksKey and failure_reason_key(rank)
// itself. For any other store those three calls do nothing, and the
// communicator's ranks watch each other through ordinary keys instead (each
// rank bumps its own beat key, and one other rank watches it; see
// communicator.h, CommOptions::heartbeat), writing the same two keys. Those
// keys carry no communicator prefix: a store serves one communicator's
// liveness (c10d hands each process group a PrefixStore of its own).
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  virtual void set(const std::string& key, const std::string& value, Deadline deadline) = 0;
  // Blocks until the key exists or the deadline passes (Timeout).
  virtual std::string get(const std::string& key, Deadline deadline) = 0;
  // Returns at once; nullopt if the key does not exist.
  virtual std::optional<std::string> try_get(const std::string& key, Deadline deadline) = 0;
  // Atomically adds delta to the integer stored at key (absent = 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta, Deadline deadline) = 0;
  // Blocks until every key exists or the deadline passes (Timeout).
  virtual void wait(const std::vector<std::string>& keys, Deadline deadline) = 0;
  // Returns at once: whether every key exists.
  virtual bool check(const std::vector<std::string>& keys, Deadline deadline) = 0;
  virtual void erase(const std::string& key, Deadline deadline) = 0;
  // Another handle on the same store, for another thread (the heartbeat's):
  // calls on the two may overlap. A store that is thread-safe may return a
  // handle sharing its connection, as long as a blocking get or wait on one
  // never holds up the other for long.
  virtual std::unique_ptr<KeyValueStore> connect_again(Deadline deadline) = 0;

  // True when the store itself watches registered ranks (see above).
  virtual bool tracks_liveness() const { return false; }
  // Registers this handle as rank's; a registered handle that drops without goodbye() fails the rank.
  virtual void hello(int /*rank*/, Deadline /*deadline*/) {}
  virtual void goodbye(Deadline /*deadline*/) {}
  // Registers this handle as rank's heartbeat: the rank promises another
  // beat within `interval` (see kSilentHeartbeats).
  virtual void heartbeat(int /*rank*/, std::chrono::milliseconds /*interval*/, Deadline /*deadline*/) {}
};

// One connection to a StoreServer; not thread-safe (one client per thread).
// Every call takes a deadline and throws Timeout past it, PeerFailure(-1) if
// the server is gone. Tracks liveness (hello, goodbye, heartbeat).
class StoreClient final : public KeyValueStore {
 public:
  // Retries the connection until the deadline (the server may start later).
  // With a secret, proves it to the store right after connecting.
  StoreClient(const std::string& host, uint16_t port, Deadline deadline, const std::string& secret = {});
  ~StoreClient() override;
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value, Deadline deadline) override;
  std::string get(const std::string& key, Deadline deadline) override;
  std::optional<std::string> try_get(const std::string& key, Deadline deadline) override;
  int64_t add(const std::string& key, int64_t delta, Deadline deadline) override;
  void wait(const std::vector<std::string>& keys, Deadline deadline) override;
  bool check(const std::vector<std::string>& keys, Deadline deadline) override;
  void erase(const std::string& key, Deadline deadline) override;
  // A new connection to the same server, with the same secret.
  std::unique_ptr<KeyValueStore> connect_again(Deadline deadline) override;

  bool tracks_liveness() const override { return true; }
  void hello(int rank, Deadline deadline) override;
  void goodbye(Deadline deadline) override;
  void heartbeat(int rank, std::chrono::milliseconds interval, Deadline deadline) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "host:port" -> pair; throws InvalidArgument naming the text on a bad address.
std::pair<std::string, uint16_t> parse_host_port(const std::string& address);

}  // namespace tandem
