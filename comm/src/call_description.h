// What a collective call is on the wire and in error texts: the tag layout,
// Description, the Fingerprint ranks compare over UCX, and the texts naming a call.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tandem/types.h"

namespace tandem {

// Tag layout: collective signature | sequence number | sending rank |
// algorithm's own tag. The signature (which collective, which dtype) keeps
// mismatched calls from ever matching each other's data; the fingerprints
// (signature kFingerprintSignature) then say what differs. Sequence numbers
// wrap; collectives are strictly ordered.
constexpr int kSignatureBits = 8;
constexpr int kSeqBits = 12;
constexpr int kRankBits = 12;
constexpr int kLocalBits = 32;
constexpr int kMaxRanks = 1 << kRankBits;
// What ranks must agree on to talk at all (tags, fingerprints, store keys);
// raised whenever any of them changes. Checked at start-up with the build id.
constexpr int kWireProtocol = 3;

// What a collective is, for error messages; formatted only when one is thrown,
// since building strings would cost more than a small collective.
struct Description {
  Collective collective{};
  size_t count = 0;
  std::optional<DataType> dtype{};
  std::optional<ReduceOp> op{};
  int root = -1;     // rooted collectives only; send/recv: the peer
  uint32_t tag = 0;  // send/recv only

  // The Collective's number, as on the wire.
  uint32_t kind() const { return uint32_t(collective); }
  // 5 bits of collective kind, 3 of dtype. Point-to-point messages leave the
  // dtype out: a receive of another dtype fails on its size, never hangs.
  uint32_t signature() const { return (kind() << 3) | (dtype && !point_to_point() ? uint32_t(*dtype) + 1 : 0); }
  // Exchanges and send/recv: messages between the ranks they address.
  bool point_to_point() const { return is_point_to_point(collective); }

  std::string str() const {
    if (!dtype) return to_string(collective);
    // Counts that differ by rank leave the fingerprint (a peer's reads 0):
    // named by kind and dtype, as the shared-memory headers name them.
    const std::string counted = has_per_rank_counts(collective) ? "" : std::to_string(count) + " x ";
    std::string s = std::string(to_string(collective)) + "(" + counted + std::string(to_string(*dtype));
    if (op) s += ", " + std::string(to_string(*op));
    if (collective == Collective::send_recv) {
      return s + ", peer " + (root >= 0 ? std::to_string(root) : std::string("any")) + ", tag " + std::to_string(tag) +
             ")";
    }
    if (root >= 0) s += ", root " + std::to_string(root);
    return s + ")";
  }
};

// What a rank says it is calling, sent to its ring successor before a
// collective's first UCX message (the shared-memory path compares calls in its
// slot headers instead). Plain bytes; both ends are the same build.
struct Fingerprint {
  uint32_t seq = 0;
  uint8_t kind = 0, dtype = 0, op = 0;  // dtype and op + 1; 0: none
  uint8_t unused = 0;
  int32_t root = -1;
  uint64_t count = 0;

  static Fingerprint of(const Description& d, uint32_t seq) {
    return {seq,
            uint8_t(d.kind()),
            uint8_t(d.dtype ? uint8_t(*d.dtype) + 1 : 0),
            uint8_t(d.op ? uint8_t(*d.op) + 1 : 0),
            0,
            d.root,
            has_per_rank_counts(d.collective) ? 0 : d.count};
  }
  Description description() const {
    Description d{Collective(kind), size_t(count), std::nullopt, std::nullopt, root};
    if (dtype) d.dtype = DataType(dtype - 1);
    if (op) d.op = ReduceOp(op - 1);
    return d;
  }
  // The first field that differs, in the order a reader would check them; nullptr if none.
  const char* differing(const Fingerprint& o) const {
    if (seq != o.seq) return "sequence number";
    if (kind != o.kind) return "kind";
    if (op != o.op) return "op";
    if (dtype != o.dtype) return "dtype";
    if (count != o.count) return "count";
    if (root != o.root) return "root";
    return nullptr;
  }
};
static_assert(sizeof(Fingerprint) == 24);
// The tag signature of fingerprints: kind 31, dtype 7, which no collective has.
constexpr uint32_t kFingerprintSignature = (1u << kSignatureBits) - 1;

// "allreduce #12 (1024 x f32, sum) on rank 0 (waiting for rank 1)": seq numbers the communicator's collectives from 1.
std::string describe_wait(const Description& what, uint32_t seq, int rank, int peer);

// "mismatched collectives at call #5 (the count differs): rank 0 called allreduce(100 x f32, sum), rank 1 called ...".
std::string mismatch_text(uint32_t seq, const char* field, int rank_a, const Description& a, int rank_b,
                          const Description& b);

}  // namespace tandem
