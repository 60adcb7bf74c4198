// Formats a call for error messages: where a rank waits, and how two ranks' calls differ.
#include "call_description.h"

namespace tandem {

// "allreduce #12 (1024 x f32, sum) on rank 0 (waiting for rank 1)": seq numbers the communicator's collectives from 1.
std::string describe_wait(const Description& what, uint32_t seq, int rank, int peer) {
  const std::string waiting = peer >= 0 ? "(waiting for rank " + std::to_string(peer) + ")" : "(waiting for any rank)";
  if (what.collective == Collective::send_recv) return what.str() + " on rank " + std::to_string(rank) + " " + waiting;
  if (what.point_to_point()) return "point-to-point exchange on rank " + std::to_string(rank) + " " + waiting;
  std::string call = what.str();
  const auto paren = call.find('(');
  call = paren == std::string::npos ? call + " #" + std::to_string(seq)
                                    : call.substr(0, paren) + " #" + std::to_string(seq) + " " + call.substr(paren);
  return call + " on rank " + std::to_string(rank) + " " + waiting;
}

// "mismatched collectives at call #5 (the count differs): rank 0 called allreduce(100 x f32, sum), rank 1 called ...".
std::string mismatch_text(uint32_t seq, const char* field, int rank_a, const Description& a, int rank_b,
                          const Description& b) {
  return "mismatched collectives at call #" + std::to_string(seq) + " (the " + field + " differs): rank " +
         std::to_string(rank_a) + " called " + a.str() + ", rank " + std::to_string(rank_b) + " called " + b.str() +
         "; every rank must issue the same collectives with the same arguments in the same order";
}

}  // namespace tandem
