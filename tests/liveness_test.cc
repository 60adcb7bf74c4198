// Every blocking call against a peer that never answers: each must fail by
// its deadline (plus a small slack) with an error that says what it waited
// for. The table covers connecting to a store that accepts but never
// replies, store get and wait, the rendezvous with a rank that never comes,
// every collective (through shared memory and over UCX only) with a rank
// that is alive and heartbeating but never calls, and teardown while that
// rank never arrives at the finalize barrier.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "multiprocess.h"
#include "tandem/errors.h"
#include "tandem/ring/ring.h"
#include "tandem/store.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

constexpr auto kSlack = 1500ms;  // deadline to exception, on a loaded 2-core machine

// Runs `call`, which must throw an Error within `bound` whose text holds `says`.
// Returns an empty string if so, else what went wrong.
std::string fails_in_time(const std::function<void()>& call, Clock::duration bound, const std::string& says) {
  const auto start = Clock::now();
  try {
    call();
  } catch (const Error& e) {
    const auto took = Clock::now() - start;
    const auto ms = std::chrono::duration_cast<milliseconds>(took).count();
    if (took > bound) return "failed after " + std::to_string(ms) + " ms: " + e.what();
    if (std::string(e.what()).find(says) == std::string::npos) return "error does not say '" + says + "': " + e.what();
    std::printf("  failed in %lld ms: %s\n", static_cast<long long>(ms), e.what());
    return {};
  }
  return "returned instead of failing";
}

// A TCP port that accepts connections (the kernel does, from the backlog) and never says a word.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    listen(fd_, 16);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { close(fd_); }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

TEST(Liveness, StoreCallsFailByTheirDeadline) {
  SilentListener silent;
  // Without a secret the connection is all connect() does; the first request then waits for the answer.
  EXPECT_EQ(fails_in_time(
                [&] {
                  const Deadline d = Clock::now() + 1s;
                  StoreClient c("127.0.0.1", silent.port(), d);
                  c.hello(0, d);
                },
                1s + kSlack, "127.0.0.1:" + std::to_string(silent.port())),
            "")
      << "connect and hello to a store that never answers";
  // With a secret, connecting includes the handshake.
  EXPECT_EQ(fails_in_time([&] { StoreClient c("127.0.0.1", silent.port(), Clock::now() + 1s, std::string(64, 's')); },
                          1s + kSlack, "127.0.0.1:" + std::to_string(silent.port())),
            "")
      << "connect with the handshake to a store that never answers";
  StoreServer server;
  StoreClient c("127.0.0.1", server.port(), Clock::now() + 5s);
  EXPECT_EQ(fails_in_time([&] { c.get("never/set", Clock::now() + 1s); }, 1s + kSlack, "never/set"), "") << "get";
  EXPECT_EQ(fails_in_time(
                [&] {
                  c.wait({"a", "never/either"}, Clock::now() + 1s);
                },
                1s + kSlack, "never/either"),
            "")
      << "wait";
}

TEST(Liveness, RendezvousWithARankThatNeverComes) {
  StoreServer server;
  CommOptions o;
  o.rank = 0;
  o.size = 2;
  o.store_address = server.address();
  o.connect_timeout = 2s;
  o.prefix = unique_prefix();
  EXPECT_EQ(fails_in_time([&] { ring::connect(o, {}); }, 2s + kSlack, "rank 1 never arrived"), "");
}

struct Blocking {
  const char* name;
  std::function<void(Communicator&)> call;
};

const Blocking kCalls[] = {
    {"allreduce",
     [](Communicator& c) {
       std::vector<float> x(1024, 1.0f);
       c.allreduce(x.data(), x.size(), DataType::f32, ReduceOp::sum);
     }},
    {"reduce_scatter",
     [](Communicator& c) {
       std::vector<float> in(2048, 1.0f), out(1024);
       c.reduce_scatter(in.data(), out.data(), out.size(), DataType::f32, ReduceOp::sum);
     }},
    {"allgather",
     [](Communicator& c) {
       std::vector<float> in(1024, 1.0f), out(2048);
       c.allgather(in.data(), out.data(), in.size(), DataType::f32);
     }},
    {"broadcast",
     [](Communicator& c) {
       std::vector<float> x(1024, 1.0f);
       c.broadcast(x.data(), x.size(), DataType::f32, /*root=*/1);
     }},
    {"barrier", [](Communicator& c) { c.barrier(); }},
};

// Rank 0 makes the call; rank 1 is connected, alive and heartbeating, but never calls.
TEST(Liveness, EveryCollectiveAgainstARankThatNeverCalls) {
  for (bool shared : {true, false}) {
    for (const Blocking& b : kCalls) {
      SCOPED_TRACE(std::string(b.name) + (shared ? ", shared memory" : ", UCX only"));
      std::printf("%s, %s:\n", b.name, shared ? "shared memory" : "UCX only");
      CommOptions base;
      ring::RingOptions ring_base;
      ring_base.shared_memory = shared;
      base.timeout = 1s;
      base.flight_entries = 0;
      RankGroup group(
          2,
          [&](const CommOptions& o) {
            auto comm = ring::connect(o, ring_base);
            if (o.rank == 1) {
              std::this_thread::sleep_for(60s);  // the test kills it
              return 8;
            }
            const std::string why = fails_in_time([&] { b.call(*comm); }, 1s + kSlack, "timed out after 1000 ms");
            if (!why.empty()) std::fprintf(stderr, "%s: %s\n", b.name, why.c_str());
            return why.empty() ? 0 : 5;
          },
          base);
      auto codes = group.wait_for_all_but(1, 30s);
      EXPECT_EQ(codes[0], 0);
    }
  }
}

// Teardown: rank 0 destroys its communicator while rank 1 never does; the
// finalize barrier is bounded (10 s), and the destructor must not hang.
TEST(Liveness, TeardownWhileAPeerNeverArrives) {
  RankGroup group(2, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    std::vector<float> x(16, 1.0f);
    comm->allreduce(x.data(), x.size(), DataType::f32, ReduceOp::sum);
    if (o.rank == 1) {
      std::this_thread::sleep_for(60s);
      return 8;
    }
    const auto start = Clock::now();
    comm.reset();
    const auto took = Clock::now() - start;
    std::printf("  teardown without the peer took %lld ms\n",
                static_cast<long long>(std::chrono::duration_cast<milliseconds>(took).count()));
    return took < 10s + kSlack ? 0 : 5;
  });
  auto codes = group.wait_for_all_but(1, 40s);
  EXPECT_EQ(codes[0], 0);
}

}  // namespace
}  // namespace tandem::testing
