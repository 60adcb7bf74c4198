// Growing a communicator: grow() on the members, join() in a new process.
// A joiner takes a ticket from the job's store (an atomic add under
// "<prefix>/join/"), says who it is (its number in the job, its host) and
// waits for its place. The first member to reach a grow() (an atomic add
// decides) claims the tickets waiting, up to max_new, writes each joiner its
// place (the new communicator's keys, size, rank, every rank's number in the
// job and host) and then the decision every member reads. Members and
// joiners then wire up the new communicator through the store under the
// grow's keys, as split() does. Joiners take the ranks after the members',
// in ticket order.
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "communicator_impl.h"
#include "decision.h"
#include "prefix_store.h"
#include "subsystem_log.h"
#include "transport/shared_segments.h"

namespace tandem {
namespace {

std::string join_key(const CommOptions& o, const std::string& k) { return o.prefix + "/join/" + k; }

// How long a grow waits for a claimed joiner to say who it is (it does so
// right after taking its ticket), and a joiner whose ticket was claimed as it
// gave up waits for its place.
constexpr auto kWhoPatience = std::chrono::seconds(2);
constexpr auto kPlacePatience = std::chrono::seconds(10);

std::string own_host(const CommOptions& o) { return o.host_id.empty() ? host_identity() : o.host_id; }

struct Joiner {
  int64_t ticket = 0;
  int number = -1;  // in the job (its root rank), -1: none
  std::string host;
};

// "<number>\t<host>" (one line) and back.
std::string describe_joiner(const Joiner& j) { return std::to_string(j.number) + "\t" + j.host; }
Joiner parse_joiner(int64_t ticket, const std::string& text) {
  const size_t tab = text.find('\t');
  return {ticket, std::atoi(text.substr(0, tab).c_str()), tab == std::string::npos ? "" : text.substr(tab + 1)};
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Where a joiner's place lies, and what it says: the new communicator's keys
// in the root store, its opts.prefix, size, the joiner's rank, each rank's
// number in the job (comma-separated), the members' shared-memory segment
// bytes, and each rank's host, one a line.
struct Place {
  std::string raw_prefix, prefix;
  int size = 0, rank = 0;
  std::vector<int> numbers;
  size_t shared_bytes = 0;
  std::vector<std::string> hosts;

  std::string str() const {
    std::string out = raw_prefix + "\n" + prefix + "\n" + std::to_string(size) + "\n" + std::to_string(rank) + "\n" +
                      format_rank_list(numbers) + "\n" + std::to_string(shared_bytes) + "\n";
    for (const auto& h : hosts) out += h + "\n";
    return out;
  }
  static Place parse(const std::string& text) {
    const std::vector<std::string> l = lines(text);
    if (l.size() < 6) throw Error("join: malformed place from the members: '" + text + "'");
    Place p{l[0],
            l[1],
            std::atoi(l[2].c_str()),
            std::atoi(l[3].c_str()),
            parse_rank_list(l[4]),
            size_t(std::strtoull(l[5].c_str(), nullptr, 10)),
            {}};
    p.hosts.assign(l.begin() + 6, l.end());
    return p;
  }
};

// Tickets taken and not yet claimed (a withdrawn one counts until a grow claims it).
int64_t joiners_waiting_in(KeyValueStore& root, const CommOptions& o, Deadline deadline) {
  const int64_t claimed = root.add(join_key(o, "claimed"), 0, deadline);
  return std::max<int64_t>(0, root.add(join_key(o, "tickets"), 0, deadline) - claimed);
}

// The first member at a grow(): claims `take` waiting joiners (at least one)
// and writes each its place. Returns the joiners, in rank order.
std::vector<Joiner> admit(KeyValueStore& root, const CommContext& ctx, Place place, int64_t take, Deadline deadline) {
  const CommOptions& o = ctx.opts;
  const int64_t last = root.add(join_key(o, "claimed"), take, deadline);
  std::vector<Joiner> joiners;
  for (int64_t t = last - take + 1; t <= last; ++t) {
    // The ticket is this grow's unless its joiner withdrew first (it gave up waiting): one add decides.
    if (root.add(join_key(o, std::to_string(t) + "/state"), 1, deadline) != 1) continue;
    // A joiner writes who it is right after it takes its ticket; one that died in between is skipped.
    std::optional<std::string> who;
    try {
      who = root.get(join_key(o, std::to_string(t) + "/who"), std::min(deadline, Clock::now() + kWhoPatience));
    } catch (const Timeout&) {
      subsystem_log(Subsystem::comm).warn("tandem: joiner #{} never said who it is; it is not admitted", t);
      continue;
    }
    joiners.push_back(parse_joiner(t, *who));
    Joiner& j = joiners.back();
    const bool taken = std::find(place.numbers.begin(), place.numbers.end(), j.number) != place.numbers.end();
    if (taken || (j.number >= 0 && root.try_get(failure_reason_key(j.number), deadline))) {
      subsystem_log(Subsystem::comm)
          .warn("tandem: a joiner says it is process {} of the job, which {}; it joins without a number", j.number,
                taken ? "is a member" : "failed before");
      j.number = -1;
    }
    place.numbers.push_back(j.number);
    place.hosts.push_back(j.host);
  }
  place.size = int(place.numbers.size());
  for (size_t i = 0; i < joiners.size(); ++i) {
    place.rank = place.size - int(joiners.size()) + int(i);
    root.set(join_key(o, std::to_string(joiners[i].ticket) + "/place"), place.str(), deadline);
  }
  return joiners;
}

// The rank's place among its host's ranks in the new communicator.
void set_local(CommOptions& o, const std::vector<std::string>& hosts) {
  const Topology t = make_topology(hosts, o.rank);
  o.local_rank = t.local_rank();
  o.local_size = t.local_size();
}

// The job's store as this communicator sees it; a job of one rank has one
// only if a launcher gave it one (`own` then holds the connection), else null.
KeyValueStore* job_store(const CommContext& ctx, std::unique_ptr<KeyValueStore>& own, Deadline deadline) {
  if (ctx.store) return ctx.store.get();
  if (ctx.opts.store_address.empty()) return nullptr;
  auto [host, port] = parse_host_port(ctx.opts.store_address);
  own = std::make_unique<StoreClient>(host, port, deadline, ctx.opts.secret);
  return own.get();
}

}  // namespace

int Communicator::joiners_waiting(const CollectiveOptions& opts) {
  const CommContext& ctx = impl_->ctx;
  const Deadline deadline = Clock::now() + opts.timeout.value_or(ctx.opts.timeout);
  std::unique_ptr<KeyValueStore>& probe = impl_->join_probe;
  if (!probe) {
    std::unique_ptr<KeyValueStore> own;
    KeyValueStore* store = job_store(ctx, own, deadline);
    if (!store) return 0;  // nobody can reach this job to join it
    probe = own ? std::move(own) : PrefixStore::root_of(*store, deadline);
  }
  return int(joiners_waiting_in(*probe, ctx.opts, deadline));
}

Communicator::Grown Communicator::grow(int max_new, const CollectiveOptions& opts) {
  if (max_new < 0) throw InvalidArgument("grow: max_new is " + std::to_string(max_new) + "; it must be 0 or more");
  CommContext& ctx = impl_->ctx;
  const Deadline deadline = Clock::now() + opts.timeout.value_or(ctx.opts.timeout);
  std::unique_ptr<KeyValueStore> own_store;
  KeyValueStore* found = job_store(ctx, own_store, deadline);
  if (!found) return {};  // nobody can be waiting
  KeyValueStore& store = *found;
  const uint64_t number = ++impl_->grows;  // the same on every member: grows are collective
  const std::string base = ctx.key("grow/" + std::to_string(number));

  // Every member's number in the job and host: the joiners learn them from
  // their place. Read only when needed (a store read per member), so a grow
  // with nobody waiting costs a member two store round trips.
  Place place{
      PrefixStore::raw_prefix_of(store) + base, ctx.opts.prefix, 0, 0, {}, impl_->algorithms->shared_bytes(), {}};
  const auto fill_place = [&] {
    for (int r = 0; r < size(); ++r) {
      place.numbers.push_back(PrefixStore::root_rank_of(store, r));
      place.hosts.push_back(own_store ? own_host(ctx.opts)
                                      : store.get(ctx.key("topology/" + std::to_string(r)), deadline));
    }
  };
  if (store.add(base + "/arrived", 1, deadline) == 1) {
    store.set(base + "/decider", std::to_string(rank()), deadline);
    std::unique_ptr<KeyValueStore> root = PrefixStore::root_of(store, deadline);
    std::string decision;
    if (const int64_t take = std::min<int64_t>(joiners_waiting_in(*root, ctx.opts, deadline), max_new); take > 0) {
      fill_place();
      for (const Joiner& j : admit(*root, ctx, place, take, deadline)) decision += describe_joiner(j) + "\n";
    }
    store.set(base + "/decision", decision.empty() ? "none" : decision, deadline);
    // Every member that reached the last grow has read the one before.
    if (number > 2 && store.add(ctx.key("grow/" + std::to_string(number - 1) + "/arrived"), 0, deadline) == size()) {
      for (const char* k : {"/arrived", "/decider", "/decision"})
        store.erase(ctx.key("grow/" + std::to_string(number - 2)) + k, deadline);
    }
  }
  const std::optional<std::string> made =
      await_decision(store, base + "/decision", base + "/decider", deadline, "grow #" + std::to_string(number));
  if (!made) {
    const int decider = std::atoi(store.get(base + "/decider", deadline).c_str());
    throw PeerFailure(decider, "grow #" + std::to_string(number) + ": rank " + std::to_string(decider) +
                                   " failed while deciding who joins; this communicator is as before (shrink past "
                                   "it, then grow again)");
  }
  const std::string& decision = *made;
  if (decision == "none") return {};
  if (place.numbers.empty()) fill_place();

  Grown grown;
  std::vector<int> extra;
  for (const std::string& line : lines(decision)) {
    const Joiner j = parse_joiner(0, line);
    extra.push_back(j.number);
    place.hosts.push_back(j.host);
  }
  grown.joined = int(extra.size());
  CommOptions o = ctx.opts;
  o.size = size() + grown.joined;
  o.host_store = false;
  o.interface_chosen = false;  // the joiners take part in a new selection
  set_local(o, place.hosts);
  std::vector<int> members;
  for (int r = 0; r < size(); ++r) members.push_back(r);
  o.store = PrefixStore::within(store, base, members, extra, Clock::now() + ctx.opts.connect_timeout);
  grown.comm = Communicator::create(o, impl_->algorithms);
  grown.comm->impl_->server = impl_->server;
  return grown;
}

bool Communicator::joined() const { return impl_->joined; }

std::unique_ptr<Communicator> Communicator::join(CommOptions o, std::shared_ptr<Algorithms> algorithms) {
  const Deadline deadline = Clock::now() + o.connect_timeout;
  std::shared_ptr<KeyValueStore> root = o.store;
  if (!root) {
    if (o.store_address.empty()) {
      throw InvalidArgument("join: a joining process needs the job's store: set TANDEM_STORE_ADDR=host:port");
    }
    auto [host, port] = parse_host_port(o.store_address);
    root = std::make_shared<StoreClient>(host, port, deadline, o.secret);
  }
  const int64_t ticket = root->add(join_key(o, "tickets"), 1, deadline);
  root->set(join_key(o, std::to_string(ticket) + "/who"), describe_joiner({ticket, o.rank, own_host(o)}), deadline);
  const std::string place_key = join_key(o, std::to_string(ticket) + "/place");
  std::optional<std::string> text;
  try {
    text = root->get(place_key, deadline);
  } catch (const Timeout&) {
    // Withdraw, unless a grow claimed the ticket first (one add decides): then its place is on the way.
    const Deadline patience = Clock::now() + kPlacePatience;
    if (root->add(join_key(o, std::to_string(ticket) + "/state"), 1, patience) == 1) {
      throw Timeout("join: no member called grow() within " + std::to_string(o.connect_timeout.count()) +
                    " ms (TANDEM_CONNECT_TIMEOUT_MS); the members admit joiners at the points they call grow()");
    }
    text = root->get(place_key, patience);
  }
  const Place place = Place::parse(*text);
  o.join = false;
  o.host_store = false;
  o.prefix = place.prefix;
  o.size = place.size;
  o.rank = place.rank;
  set_local(o, place.hosts);
  o.store = std::make_shared<PrefixStore>(root->connect_again(Clock::now() + o.connect_timeout), place.raw_prefix,
                                          place.numbers);
  // The members sized their shared segments for their host when they started; a differing size would send this
  // host's ranks through UCX.
  if (algorithms && algorithms->shared_bytes() != place.shared_bytes) {
    if (auto same = algorithms->with_shared_bytes(place.shared_bytes)) algorithms = std::move(same);
  }
  std::unique_ptr<Communicator> comm = create(o, std::move(algorithms));
  comm->impl_->joined = true;
  return comm;
}

}  // namespace tandem
