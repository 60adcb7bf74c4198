// Send/recv between real rank processes on one host, through the shared-memory
// mailbox (streamed, read by cross-memory attach past 16 KiB, or either as
// timed) and with shared memory off (UCX): random sizes (0, odd, either side
// of a slot and of two, larger than the ring), tags received out of order,
// repeated tags in order, any source, symmetric groups, receives that
// outlast the inline polling, more messages than a ring holds, size
// mismatches named, a read message held in the ring until its receive, runs
// of exchanges through a timed round's opening and past it, and the timed
// choice's verdict.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "multiprocess.h"
#include "tandem/tandem.h"
#include "transport/shm_mailbox.h"
#include "transport/shm_mailbox_wire.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

// Byte i of message `id` from rank `from`: every byte says where it belongs.
uint8_t pattern(int from, uint64_t id, size_t i) {
  return uint8_t((uint64_t(from) * 131 + id * 7919 + i * 2654435761u) >> 3);
}
std::vector<uint8_t> message(int from, uint64_t id, size_t bytes) {
  std::vector<uint8_t> m(bytes);
  for (size_t i = 0; i < bytes; ++i) m[i] = pattern(from, id, i);
  return m;
}

std::unique_ptr<Communicator> open(const CommOptions& o, bool shm) {
  ring::RingOptions ring_options;
  ring_options.shared_memory = shm;
  auto comm = ring::connect(o, ring_options);
  const bool mailbox = comm->transport_summary().find("send/recv through shared memory") != std::string::npos;
  EXPECT_EQ(mailbox, shm) << comm->transport_summary();
  return comm;
}

struct Message {
  int from, to;
  uint32_t tag;
  size_t bytes;
  uint64_t id;
};

// Every rank draws the same messages: each rank sends to random peers
// (itself included), tags from a small set so that (source, tag) repeats.
std::vector<Message> draw_messages(int n, int count, uint64_t seed) {
  // Either side of one slot's payload (8224 B) and of two (16448 B, the least that can go by cross-memory attach).
  static const size_t kSizes[] = {0, 1, 7, 32, 33, 8223, 8224, 8225, 16447, 16448, 16449, 65792, 1 << 20};
  std::mt19937_64 rng(seed);
  std::vector<Message> all;
  for (int k = 0; k < count; ++k) {
    const int from = int(rng() % uint64_t(n)), to = int(rng() % uint64_t(n));
    const size_t bytes = rng() % 3 == 0 ? size_t(rng() % 20000) : kSizes[rng() % std::size(kSizes)];
    all.push_back({from, to, uint32_t(rng() % 3), bytes, uint64_t(k)});
  }
  return all;
}

// Sends posted in order; receives posted shuffled, except that one
// (source, tag)'s stay in sending order (they are told apart by order only).
int random_messages(const CommOptions& o, bool shm) {
  auto comm = open(o, shm);
  const int n = comm->size(), r = comm->rank();
  for (int round = 0; round < 6 && !::testing::Test::HasFailure(); ++round) {
    const auto all = draw_messages(n, 40, 1000 + uint64_t(round));
    std::vector<std::vector<uint8_t>> out, in;
    std::vector<const Message*> mine;
    for (const Message& m : all) {
      if (m.from == r) out.push_back(message(r, m.id, m.bytes));
      if (m.to == r) mine.push_back(&m);
    }
    std::mt19937_64 rng(77 + uint64_t(r) + uint64_t(round));
    std::vector<const Message*> order = mine;
    std::shuffle(order.begin(), order.end(), rng);
    // Restore sending order within each (source, tag): sort each one's places by id.
    const auto same_pair = [](const Message* a, const Message* b) { return a->from == b->from && a->tag == b->tag; };
    for (size_t i = 0; i < order.size(); ++i) {
      for (size_t j = i + 1; j < order.size(); ++j) {
        if (same_pair(order[i], order[j]) && order[j]->id < order[i]->id) std::swap(order[i], order[j]);
      }
    }
    std::vector<Request> requests;
    in.resize(order.size());
    const bool receives_first = round % 2 == 0;
    auto post_receives = [&] {
      for (size_t i = 0; i < order.size(); ++i) {
        in[i].assign(order[i]->bytes, 0xee);
        requests.push_back(
            comm->recv_async(in[i].data(), order[i]->bytes, DataType::u8, order[i]->from, order[i]->tag));
      }
    };
    if (receives_first) post_receives();
    size_t k = 0;
    for (const Message& m : all) {
      if (m.from == r) requests.push_back(comm->send_async(out[k++].data(), m.bytes, DataType::u8, m.to, m.tag));
    }
    if (!receives_first) post_receives();
    for (Request& q : requests) q.wait();
    for (size_t i = 0; i < order.size(); ++i) {
      EXPECT_EQ(requests[receives_first ? i : requests.size() - order.size() + i].source(), order[i]->from);
      EXPECT_TRUE(in[i] == message(order[i]->from, order[i]->id, order[i]->bytes))
          << "round " << round << ": message " << order[i]->id << " (" << order[i]->bytes << " B, from "
          << order[i]->from << ", tag " << order[i]->tag << ")";
    }
    comm->barrier();
  }
  return 0;
}

// Blocking calls: groups exchanging with every rank, any source with large
// messages, a receive that waits for a late sender, and more messages than a
// ring holds received in reverse tag order.
int blocking_calls(const CommOptions& o, bool shm) {
  auto comm = open(o, shm);
  const int n = comm->size(), r = comm->rank();
  for (size_t bytes : {size_t(0), size_t(8), size_t(8225), size_t(16448), size_t(16449), size_t(1) << 20}) {
    std::vector<std::vector<uint8_t>> out{size_t(n)}, in{size_t(n)};
    std::vector<P2POp> ops;
    for (int p = 0; p < n; ++p) {
      out[size_t(p)] = message(r, uint64_t(p), bytes);
      in[size_t(p)].assign(bytes, 0);
      ops.push_back({P2POp::send, out[size_t(p)].data(), bytes, DataType::u8, p, 5});
      ops.push_back({P2POp::recv, in[size_t(p)].data(), bytes, DataType::u8, p, 5});
    }
    comm->group(ops);
    for (int p = 0; p < n; ++p)
      EXPECT_TRUE(in[size_t(p)] == message(p, uint64_t(r), bytes)) << bytes << " B from " << p;
  }
  // Any source, large: the returned source says whose bytes arrived.
  const size_t large = 300001;
  if (r == 0) {
    std::vector<int> seen;
    for (int i = 1; i < n; ++i) {
      std::vector<uint8_t> in(large, 0);
      const int from = comm->recv(in.data(), large, DataType::u8, kAnySource, 11);
      EXPECT_TRUE(in == message(from, 11, large)) << "from " << from;
      seen.push_back(from);
    }
    std::sort(seen.begin(), seen.end());
    for (int i = 1; i < n; ++i) EXPECT_EQ(seen[size_t(i - 1)], i);
  } else {
    const auto out = message(r, 11, large);
    comm->send(out.data(), large, DataType::u8, 0, 11);
  }
  // A late sender: the receive outlasts the inline polling and still completes.
  if (r == 1) {
    std::this_thread::sleep_for(50ms);
    const auto out = message(1, 12, 5);
    comm->send(out.data(), 5, DataType::u8, 0, 12);
  } else if (r == 0) {
    std::vector<uint8_t> in(5, 0);
    EXPECT_EQ(comm->recv(in.data(), 5, DataType::u8, kAnySource, 12), 1);
    EXPECT_TRUE(in == message(1, 12, 5));
  }
  // 40 messages (more than a ring holds; up to 5 slots each) received in
  // reverse tag order: blocking small ones, then posted ones of up to 39 KB.
  constexpr int kMany = 40;
  for (size_t scale : {size_t(1), size_t(997)}) {
    if (r == 0) {
      std::vector<std::vector<uint8_t>> out;
      std::vector<Request> sent;
      for (int t = 0; t < kMany; ++t) out.push_back(message(0, uint64_t(100 + t), size_t(t) * scale));
      for (int t = 0; t < kMany; ++t) {
        if (scale == 1) {
          comm->send(out[size_t(t)].data(), out[size_t(t)].size(), DataType::u8, 1, uint32_t(t));
        } else {
          sent.push_back(comm->send_async(out[size_t(t)].data(), out[size_t(t)].size(), DataType::u8, 1, uint32_t(t)));
        }
      }
      for (Request& q : sent) q.wait();
    } else if (r == 1) {
      for (int t = kMany - 1; t >= 0; --t) {
        std::vector<uint8_t> in(size_t(t) * scale, 0);
        comm->recv(in.data(), in.size(), DataType::u8, 0, uint32_t(t));
        EXPECT_TRUE(in == message(0, uint64_t(100 + t), in.size())) << "tag " << t << ", " << in.size() << " B";
      }
    }
  }
  comm->barrier();
  return 0;
}

// A message larger or smaller than its receive fails the receive, named.
int mismatch(const CommOptions& o, bool shm, size_t sent, size_t expected) {
  auto comm = open(o, shm);
  std::vector<float> data(std::max(sent, expected));
  try {
    if (comm->rank() == 0) {
      comm->send(data.data(), sent, DataType::f32, 1, 4);
      return 0;
    }
    comm->recv(data.data(), expected, DataType::f32, 0, 4);
    ADD_FAILURE() << "a " << sent << "-element message into a " << expected << "-element receive succeeded";
  } catch (const CollectiveMismatch& e) {
    const std::string call = "send_recv(" + std::to_string(expected) + " x f32, peer 0, tag 4)";
    EXPECT_NE(std::string(e.what()).find(call), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("size differs"), std::string::npos) << e.what();
  }
  return 0;
}

// Exchanges around a ring (rank r sends to r + 1 and receives from r - 1),
// enough of each size for the first round (64 messages, opening with one
// pair), the second round's opening (up to 24 messages) and the verdict
// after it, every message checked.
int timed_exchanges(const CommOptions& o) {
  auto comm = open(o, true);
  const int n = comm->size(), r = comm->rank(), to = (r + 1) % n, from = (r + n - 1) % n;
  for (size_t bytes : {size_t(20000), size_t(65536), size_t(1) << 20}) {
    const uint64_t count = 64 + (bytes < (size_t(1) << 20) ? 28 : 8);
    for (uint64_t k = 0; k < count; ++k) {
      const auto out = message(r, k, bytes);
      std::vector<uint8_t> in(bytes, 0);
      comm->group({{P2POp::send, const_cast<uint8_t*>(out.data()), bytes, DataType::u8, to, 3},
                   {P2POp::recv, in.data(), bytes, DataType::u8, from, 3}});
      EXPECT_TRUE(in == message(from, k, bytes)) << bytes << " B, message " << k << " from " << from;
    }
  }
  comm->barrier();
  return 0;
}

// A message read from the sender's buffer stays in the ring until its
// receive is posted (its send completes only then, read straight into the
// receive's buffer); a receive waiting behind it moves it aside.
int held_reads(const CommOptions& o) {
  auto comm = open(o, true);
  const size_t large = size_t(1) << 20;
  const auto a = message(0, 1, large), b = message(0, 2, large), c = message(0, 3, 8);
  if (comm->rank() == 0) {
    Request first = comm->send_async(a.data(), large, DataType::u8, 1, 1);
    Request second = comm->send_async(b.data(), large, DataType::u8, 1, 2);
    first.wait();
    std::this_thread::sleep_for(50ms);  // rank 1 sleeps 200 ms before receiving the second
    EXPECT_FALSE(second.test()) << "the second message was read before its receive was posted";
    second.wait();
    comm->send(a.data(), large, DataType::u8, 1, 4);
    comm->send(c.data(), 8, DataType::u8, 1, 5);
  } else if (comm->rank() == 1) {
    std::vector<uint8_t> in(large, 0);
    comm->recv(in.data(), large, DataType::u8, 0, 1);
    EXPECT_TRUE(in == a);
    std::this_thread::sleep_for(200ms);
    comm->recv(in.data(), large, DataType::u8, 0, 2);
    EXPECT_TRUE(in == b);
    std::vector<uint8_t> small(8, 0);
    comm->recv(small.data(), 8, DataType::u8, 0, 5);  // behind the large one, tag 4
    EXPECT_TRUE(small == c);
    comm->recv(in.data(), large, DataType::u8, 0, 4);
    EXPECT_TRUE(in == a);
  }
  comm->barrier();
  return 0;
}

// How ranks of one host exchange messages: UCX, the mailbox streaming
// through its slots, the mailbox reading messages past 16 KiB from the
// sender by cross-memory attach, or the mailbox timing the two (the default).
enum class Path { ucx, mailbox, mailbox_cma, mailbox_timed };

class Mailbox : public ::testing::TestWithParam<Path> {
 protected:
  static bool shm() { return GetParam() != Path::ucx; }
  static CommOptions with_path(CommOptions o) {
    if (GetParam() == Path::mailbox_cma) o.p2p_stream_max_bytes = 0;
    o.p2p_timed = GetParam() == Path::mailbox_timed;
    return o;
  }
};

TEST_P(Mailbox, RandomMessagesTagsAndOrder) {
  for (int n : {2, 3}) {
    RankGroup group(n, [](const CommOptions& o) { return random_messages(with_path(o), shm()); });
    group.expect_success(120s);
  }
}

TEST_P(Mailbox, GroupsAnySourceLateSenderAndFullRing) {
  for (int n : {2, 3}) {
    RankGroup group(n, [](const CommOptions& o) { return blocking_calls(with_path(o), shm()); });
    group.expect_success(120s);
  }
}

TEST_P(Mailbox, SizeMismatchIsNamed) {
  // One slot, several and, on the mailbox, streamed or read from the sender's memory; larger and smaller.
  std::vector<std::pair<size_t, size_t>> cases = {{8, 4}, {4, 8}, {9000, 3000}};
  if (shm()) cases.insert(cases.end(), {{100000, 50000}, {50000, 100000}});
  for (auto [sent, expected] : cases) {
    RankGroup group(2, [sent = sent, expected = expected](const CommOptions& o) {
      return mismatch(with_path(o), shm(), sent, expected);
    });
    group.expect_success(60s);
  }
}

INSTANTIATE_TEST_SUITE_P(SharedMemory, Mailbox,
                         ::testing::Values(Path::mailbox, Path::mailbox_cma, Path::mailbox_timed, Path::ucx),
                         [](const auto& info) {
                           return info.param == Path::ucx           ? "ucx"
                                  : info.param == Path::mailbox     ? "mailbox"
                                  : info.param == Path::mailbox_cma ? "mailbox_cma"
                                                                    : "mailbox_timed";
                         });

TEST(MailboxRead, AMessageWaitsInTheRingForItsReceive) {
  RankGroup group(2, [](CommOptions o) {
    o.p2p_stream_max_bytes = 0;  // every message past 16 KiB read from the sender
    o.p2p_timed = false;
    return held_reads(o);
  });
  group.expect_success(60s);
}

TEST(MailboxTimed, ExchangesThroughTheOpeningAndPastIt) {
  for (int n : {2, 3}) {
    RankGroup group(n, [](const CommOptions& o) { return timed_exchanges(o); });
    group.expect_success(120s);
  }
}

ShmMailbox::Trials trials(std::initializer_list<float> ratios) {
  ShmMailbox::Trials t;
  for (float ratio : ratios) t.read_ratio[t.pairs++] = ratio;
  return t;
}

TEST(MailboxTimed, TheMedianRatioPassesOverOneOutlier) {
  EXPECT_FLOAT_EQ(ShmMailbox::median_ratio(trials({0.5f, 9.0f, 0.6f})), 0.6f);
  EXPECT_FLOAT_EQ(ShmMailbox::median_ratio(trials({2.0f, 0.5f, 0.7f, 0.9f})), 0.8f);  // even: the middle two's mean
  EXPECT_FLOAT_EQ(ShmMailbox::median_ratio(trials({})), 1.0f);
}

TEST(MailboxTimed, PairsDecideTogetherByTheGeometricMean) {
  const float none[] = {0, 0, 0};
  EXPECT_FALSE(ShmMailbox::read_won(none, 3));  // no median in: 1, not under it
  EXPECT_DOUBLE_EQ(ShmMailbox::pooled_ratio(none, 3), 1.0);
  const float one[] = {0.5f, 0, 0};
  EXPECT_TRUE(ShmMailbox::read_won(one, 3));
  const float apart[] = {0.6f, 1.8f};  // mean 1.04: slower
  EXPECT_FALSE(ShmMailbox::read_won(apart, 2));
  const float together[] = {0.7f, 1.1f};  // 0.877
  EXPECT_TRUE(ShmMailbox::read_won(together, 2));
  const float barely[] = {0.864f, 1.087f};  // 0.969: faster, if by less than the trials understate
  EXPECT_TRUE(ShmMailbox::read_won(barely, 2));
  const float slower[] = {1.5f, 1.2f, 0.95f};
  EXPECT_FALSE(ShmMailbox::read_won(slower, 3));
  const float apart_twice[] = {0.25f, 4.0f};
  EXPECT_NEAR(ShmMailbox::pooled_ratio(apart_twice, 2), 1.0, 1e-6);
}

// A first verdict for reading, its time under 1/1.5 of streaming's, skips
// the second round's trials; one for streaming never does.
TEST(MailboxTimed, AClearFirstVerdictSettles) {
  EXPECT_TRUE(clear_win(0.4));
  EXPECT_TRUE(clear_win(1 / 1.5));
  EXPECT_FALSE(clear_win(0.7));
  EXPECT_FALSE(clear_win(1.0));
  EXPECT_FALSE(clear_win(1.5));
  EXPECT_FALSE(clear_win(3.0));
}

// Each size class's messages to one receiver: the first round opens with two
// untimed reads, then a stream trial and a read trial, each two messages the
// second timed; the second round (from message 64) opens with 3 pairs at 1 MiB
// (streaming first in even pairs), then the verdict's way until the next round.
TEST(MailboxTimed, TheScheduleOfEachSizeClass) {
  const size_t c = size_class(size_t(1) << 20);
  struct Want {
    uint64_t n;
    bool opening, trial, read;
    uint64_t number;
  };
  const Want want[] = {
      {0, true, false, true, 0},
      {1, true, false, true, 0},  // warm reads
      {2, true, false, false, 0},
      {3, true, true, false, 0},  // the stream trial
      {4, true, false, true, 1},
      {5, true, true, true, 1},  // the read trial, last: reading goes on from it
      {6, false, false, false, 0},
      {63, false, false, false, 0},
      {64, true, false, false, 0},
      {65, true, true, false, 0},  // pair 0: streaming first
      {66, true, false, true, 1},
      {67, true, true, true, 1},
      {68, true, false, true, 2},
      {69, true, true, true, 2},  // pair 1: reading first
      {70, true, false, false, 3},
      {71, true, true, false, 3},
      {72, true, false, false, 4},
      {75, true, true, true, 5},  // pair 2
      {76, false, false, false, 0},
      {64 + (1 << 14) - 1, false, false, false, 0},
      {64 + (1 << 14), true, false, false, 0},  // the third round opens
  };
  for (const Want& w : want) {
    const ShmMailbox::Scheduled s = ShmMailbox::schedule(c, w.n);
    SCOPED_TRACE("message " + std::to_string(w.n));
    EXPECT_EQ(s.opening, w.opening);
    if (!w.opening) continue;
    EXPECT_EQ(s.trial, w.trial);
    EXPECT_EQ(s.read, w.read);
    if (w.trial) {
      EXPECT_EQ(s.number, w.number);
    }
    EXPECT_EQ(s.round, w.n < 64 ? 0u : w.n < 64 + (1 << 14) ? 1u : 2u);
  }
}

}  // namespace
}  // namespace tandem::testing
