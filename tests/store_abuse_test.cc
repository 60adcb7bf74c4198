// Store abuse while a real job uses it: four rank processes rendezvous and run
// all-reduces through a store that, at the same time, receives random bytes,
// truncated frames, a 2^63 length, 1,000 idle connections, a slow-drip
// client, frames too big for the buffer budget and a client that never reads
// its replies. The job must finish with exact results, every abusive
// connection must be closed within its timeout, nobody may be recorded as
// failed, and the store's memory must stay within its budget.
//
// Also here: the connection cap (the oldest connection that never identified
// itself makes room) and the data cap (a set past max_data_bytes is refused
// with an error, the connection and the store stay usable).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <future>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "multiprocess.h"
#include "tandem/errors.h"
#include "tandem/ring/ring.h"
#include "tandem/store.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint16_t kOpSet = 1, kOpTryGet = 3, kOpGet = 2;

std::string header(uint16_t opcode, uint32_t key_bytes, uint32_t value_bytes) {
  std::string out(16, '\0');
  const uint32_t magic = kStoreMagic;
  const uint16_t version = kStoreVersion;
  std::memcpy(out.data(), &magic, 4);  // this machine is little-endian, as is the wire
  std::memcpy(out.data() + 4, &version, 2);
  std::memcpy(out.data() + 6, &opcode, 2);
  std::memcpy(out.data() + 8, &key_bytes, 4);
  std::memcpy(out.data() + 12, &value_bytes, 4);
  return out;
}

std::string frame(uint16_t opcode, const std::string& key, const std::string& value) {
  return header(opcode, key.size(), value.size()) + key + value;
}

// A plain TCP client with no protocol logic, so it can send anything.
class Raw {
 public:
  explicit Raw(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      throw std::runtime_error(std::string("raw connect: ") + std::strerror(errno));
  }
  ~Raw() {
    if (fd_ >= 0) close(fd_);
  }
  Raw(Raw&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Raw(const Raw&) = delete;

  // False once the server has closed (the write fails).
  bool send(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += n;
    }
    return true;
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// Waits until the server has closed every socket (EOF or reset; replies are
// read and dropped). Returns how many were still open at the deadline.
size_t still_open_after(std::vector<Raw*> socks, Clock::duration limit) {
  const auto deadline = Clock::now() + limit;
  char sink[4096];
  while (!socks.empty() && Clock::now() < deadline) {
    std::vector<pollfd> fds;
    for (auto* s : socks) fds.push_back({s->fd(), POLLIN, 0});
    if (poll(fds.data(), fds.size(), 50) <= 0) continue;
    std::vector<Raw*> open;
    for (size_t i = 0; i < fds.size(); ++i) {
      bool gone = false;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t n = recv(fds[i].fd, sink, sizeof sink, MSG_DONTWAIT);
        gone = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
      }
      if (!gone) open.push_back(socks[i]);
    }
    socks.swap(open);
  }
  return socks.size();
}

std::vector<Raw*> ptrs(std::vector<Raw>& v) {
  std::vector<Raw*> out;
  for (auto& r : v) out.push_back(&r);
  return out;
}

long rss_kib(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field)));
  return -1;
}

TEST(StoreAbuse, FourRankJobCompletesWhileTheStoreIsAbused) {
  StoreServerOptions store;
  store.first_frame_timeout = 2s;
  store.frame_timeout = 2s;
  store.max_buffered_bytes = 32 << 20;
  constexpr int kRanks = 4;
  RankGroup group(
      kRanks,
      [](const CommOptions& o) {
        std::this_thread::sleep_for(300ms);  // the idle crowd is in place first
        auto comm = ring::connect(o, {});
        std::vector<float> x(4096);
        for (int i = 0; i < 100; ++i) {
          std::fill(x.begin(), x.end(), float(o.rank + 1));
          comm->allreduce(x.data(), x.size(), DataType::f32, ReduceOp::sum);
          for (float v : x)
            if (v != 10.0f) return 9;  // 1 + 2 + 3 + 4
        }
        return 0;
      },
      {}, store);
  const uint16_t port = group.store().port();
  const long rss_before = rss_kib("VmRSS:");
  const auto start = Clock::now();

  // 1,000 idle connections: closed at first_frame_timeout.
  std::vector<Raw> idle;
  for (int i = 0; i < 1000; ++i) idle.emplace_back(port);

  // Random bytes: the first header fails validation at once.
  std::mt19937 rng(42);
  std::vector<Raw> random;
  for (int i = 0; i < 20; ++i) {
    std::string junk(4096, '\0');
    for (auto& c : junk) c = char(rng());
    random.emplace_back(port);
    random.back().send(junk);
  }
  // A 2^63 length where a frame's lengths are (u64 little-endian over key and
  // value bytes): value_bytes = 2^31 is past the cap, refused from the header.
  Raw huge(port);
  {
    std::string h = header(kOpSet, 0, 0);
    const uint64_t two63 = uint64_t{1} << 63;
    std::memcpy(h.data() + 8, &two63, 8);
    huge.send(h);
  }
  // A GET that asks the server to wait 2^63 ms: parked (clamped), the connection stays in step.
  Raw forever(port);
  {
    std::string wait(8, '\0');
    const uint64_t two63 = uint64_t{1} << 63;
    std::memcpy(wait.data(), &two63, 8);
    forever.send(frame(kOpGet, "never/set", wait));
  }
  // Truncated frames: header and part of the body, then silence.
  std::vector<Raw> truncated;
  for (int i = 0; i < 20; ++i) {
    truncated.emplace_back(port);
    truncated.back().send(header(kOpSet, 10, 100) + std::string(50, 'x'));
  }
  // Frames bigger than the buffer budget together: 48 x 1 MiB of 60 MiB values.
  std::vector<Raw> bulky;
  for (int i = 0; i < 48; ++i) {
    bulky.emplace_back(port);
    bulky.back().send(header(kOpSet, 1, 60 << 20) + "k" + std::string(1 << 20, 'v'));
  }
  // A client that never reads its replies: 200 gets of a 1 MiB value.
  Raw deaf(port);
  auto deaf_sender = std::async(std::launch::async, [&] {
    std::string requests = frame(kOpSet, "abuse/big", std::string(1 << 20, 'b'));
    for (int i = 0; i < 200; ++i) requests += frame(kOpTryGet, "abuse/big", "");
    deaf.send(requests);  // blocks until the server cuts it off
  });
  // A slow drip: one byte of a valid frame every 100 ms (116 bytes would take 11.6 s).
  Raw drip(port);
  auto dripper = std::async(std::launch::async, [&] {
    const std::string f = frame(kOpSet, "drip", std::string(100, 'd'));
    for (char c : f) {
      if (!drip.send(std::string(1, c))) return Clock::now();
      std::this_thread::sleep_for(100ms);
    }
    return Clock::now();
  });

  EXPECT_EQ(still_open_after({&huge}, 1s), 0u) << "the 2^63 length was not refused";
  EXPECT_EQ(still_open_after(ptrs(random), 1s), 0u) << "random bytes were not refused";
  EXPECT_EQ(still_open_after(ptrs(idle), 6s), 0u) << "idle connections outlived first_frame_timeout";
  EXPECT_EQ(still_open_after(ptrs(truncated), 3s), 0u) << "truncated frames outlived frame_timeout";
  EXPECT_EQ(still_open_after(ptrs(bulky), 3s), 0u) << "bulky partial frames outlived frame_timeout";
  EXPECT_EQ(still_open_after({&deaf}, 5s), 0u) << "a client that never reads was not cut off";
  const auto drip_cut = dripper.get();
  EXPECT_LT(drip_cut - start, 5s) << "the slow drip was not cut off at frame_timeout";
  deaf_sender.get();
  EXPECT_EQ(still_open_after({&forever}, 200ms), 1u) << "a parked get was dropped";

  group.expect_success(60s);
  EXPECT_TRUE(group.store().failed_ranks().empty());
  StoreClient after("127.0.0.1", port, Clock::now() + 5s);
  after.set("after/abuse", "fine", Clock::now() + 5s);
  EXPECT_EQ(after.get("after/abuse", Clock::now() + 5s), "fine");
  EXPECT_EQ(after.try_get("drip", Clock::now() + 5s), std::nullopt) << "the dripped frame must never complete";

  const long rss_after = rss_kib("VmRSS:"), peak = rss_kib("VmHWM:");
  std::printf(
      "store abuse: RSS %ld KiB before, %ld KiB after (+%ld KiB), peak %ld KiB (+%ld KiB); "
      "max_buffered_bytes %zu KiB\n",
      rss_before, rss_after, rss_after - rss_before, peak, peak - rss_before, store.max_buffered_bytes >> 10);
  // The budget plus 32 MiB bounds it: the test's own sockets, threads and
  // requests are in this process too, and freed frame buffers stay in malloc's heap.
  EXPECT_LT(peak - rss_before, long(store.max_buffered_bytes >> 10) + 32 * 1024);
}

TEST(StoreAbuse, FullStoreEvictsTheOldestUnidentifiedConnection) {
  StoreServerOptions o;
  o.max_connections = 8;
  StoreServer server(o);
  StoreClient first("127.0.0.1", server.port(), Clock::now() + 5s);
  first.set("k", "v", Clock::now() + 5s);  // identified: never evicted
  std::vector<Raw> idle;
  for (int i = 0; i < 20; ++i) idle.emplace_back(server.port());
  // 1 identified + 20 idle through a cap of 8: the 13 oldest idle ones made room.
  std::vector<Raw*> oldest, newest;
  for (int i = 0; i < 20; ++i) (i < 13 ? oldest : newest).push_back(&idle[i]);
  EXPECT_EQ(still_open_after(oldest, 2s), 0u);
  EXPECT_EQ(still_open_after(newest, 300ms), newest.size());
  EXPECT_EQ(first.get("k", Clock::now() + 5s), "v");
  StoreClient late("127.0.0.1", server.port(), Clock::now() + 5s);
  EXPECT_EQ(late.get("k", Clock::now() + 5s), "v");
}

TEST(StoreAbuse, DataCapRefusesTheSetAndKeepsServing) {
  StoreServerOptions o;
  o.max_data_bytes = 1 << 20;
  StoreServer server(o);
  StoreClient c("127.0.0.1", server.port(), Clock::now() + 5s);
  c.set("a", std::string(600 << 10, 'a'), Clock::now() + 5s);
  try {
    c.set("b", std::string(600 << 10, 'b'), Clock::now() + 5s);
    ADD_FAILURE() << "a set past max_data_bytes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_data_bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.try_get("b", Clock::now() + 5s), std::nullopt);
  c.set("a", "small", Clock::now() + 5s);  // replacing frees its bytes
  c.set("b", std::string(600 << 10, 'b'), Clock::now() + 5s);
  EXPECT_EQ(c.get("b", Clock::now() + 5s).size(), size_t{600 << 10});
  c.erase("b", Clock::now() + 5s);
  c.set("c", std::string(900 << 10, 'c'), Clock::now() + 5s);
}

}  // namespace
}  // namespace tandem::testing
