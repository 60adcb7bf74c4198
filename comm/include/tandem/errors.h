// Typed errors. Every failure a caller can act on has its own type; what()
// names what went wrong and, where there is one, the fix.
#pragma once

#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller passed something impossible (bad dtype, count, rank, config).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Ranks called different collectives, or the same one with different
// arguments (or one skipped a call): what() names the call's sequence number,
// the field that differs (kind, op, dtype, count, root) and the ranks. Every
// rank in that collective fails with it.
class CollectiveMismatch : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// A deadline passed before the operation completed.
class Timeout : public Error {
 public:
  using Error::Error;
};

// A peer process died or its connection broke; rank() names it (-1 if unknown).
class PeerFailure : public Error {
 public:
  PeerFailure(int rank, const std::string& what) : Error(what), rank_(rank) {}
  int rank() const noexcept { return rank_; }

 private:
  int rank_;
};

// The communicator was aborted (by abort() or an earlier sticky failure).
class Aborted : public Error {
 public:
  using Error::Error;
};

// A rank revoked the communicator (Communicator::revoke(), ULFM's
// MPIX_Comm_revoke): every pending and later call on it, on every rank,
// fails with this; what() names the rank and its reason.
class Revoked : public Aborted {
 public:
  using Aborted::Aborted;
};

// Communicator::shrink() left this rank out (recorded as failed, excluded by
// a survivor, too late), or found no majority to go on with; what() says which.
class Excluded : public Revoked {
 public:
  using Revoked::Revoked;
};

}  // namespace tandem
