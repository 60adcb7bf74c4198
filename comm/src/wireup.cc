// Wire-up: the store (hosted here, reached, or handed in), the start-up
// check that every rank runs the same build, the heartbeat, then the
// endpoints; every rank leaves through a store barrier once all are connected.
#include <unistd.h>

#include <cstdlib>
#include <type_traits>

#include "communicator_impl.h"

namespace tandem {
namespace {

// The store while a communicator wires up: its waits for the other ranks'
// keys go in slices, and between slices look at the store's record of failed
// ranks, so that a rank that dies during the wire-up (a joiner killed after
// it was admitted, a rank that crashes at start) fails the others within a
// slice, naming it, instead of at connect_timeout.
class WireupStore final : public KeyValueStore {
 public:
  WireupStore(std::shared_ptr<KeyValueStore> store, int rank, int size)
      : store_(std::move(store)), rank_(rank), size_(size) {}

  std::string get(const std::string& key, Deadline d) override {
    return sliced(d, [&](Deadline slice) { return store_->get(key, slice); });
  }
  void wait(const std::vector<std::string>& keys, Deadline d) override {
    sliced(d, [&](Deadline slice) { store_->wait(keys, slice); });
  }
  void set(const std::string& key, const std::string& value, Deadline d) override { store_->set(key, value, d); }
  std::optional<std::string> try_get(const std::string& key, Deadline d) override { return store_->try_get(key, d); }
  int64_t add(const std::string& key, int64_t delta, Deadline d) override { return store_->add(key, delta, d); }
  bool check(const std::vector<std::string>& keys, Deadline d) override { return store_->check(keys, d); }
  void erase(const std::string& key, Deadline d) override { store_->erase(key, d); }
  std::unique_ptr<KeyValueStore> connect_again(Deadline d) override { return store_->connect_again(d); }
  bool tracks_liveness() const override { return store_->tracks_liveness(); }
  void hello(int rank, Deadline d) override { store_->hello(rank, d); }
  void goodbye(Deadline d) override { store_->goodbye(d); }
  void heartbeat(int rank, std::chrono::milliseconds interval, Deadline d) override {
    store_->heartbeat(rank, interval, d);
  }

 private:
  static constexpr auto kSlice = std::chrono::milliseconds(200);

  // `wait` (a get or wait until the slice's deadline) again and again until d, looking for failed ranks between.
  template <typename Wait>
  std::invoke_result_t<Wait, Deadline> sliced(Deadline d, Wait&& wait) {
    for (;;) {
      try {
        return wait(std::min(d, Clock::now() + kSlice));
      } catch (const Timeout&) {
        if (Clock::now() >= d) throw;
        throw_if_one_failed();
      }
    }
  }

  void throw_if_one_failed() {
    const Deadline d = Clock::now() + std::chrono::seconds(2);
    const std::optional<std::string> failed = store_->try_get(kFailedRanksKey, d);
    for (int r : failed ? parse_rank_list(*failed) : std::vector<int>{}) {
      if (r < 0 || r >= size_ || r == rank_) continue;
      const std::optional<std::string> why = store_->try_get(failure_reason_key(r), d);
      throw PeerFailure(r, "rank " + std::to_string(r) + " failed while the communicator was being set up" +
                               (why ? " (" + *why + ")" : std::string()));
    }
  }

  std::shared_ptr<KeyValueStore> store_;
  int rank_, size_;
};

}  // namespace

void Communicator::Impl::connect() {
  CommOptions& opts = ctx.opts;
  const Deadline deadline = Clock::now() + opts.connect_timeout;
  if (opts.store) {
    ctx.store = opts.store;
  } else {
    auto [host, port] = parse_host_port(opts.store_address);
    if (opts.host_store) {
      StoreServerOptions so;
      so.host = host;
      so.port = port;
      so.secret = opts.secret;
      server = std::make_shared<StoreServer>(so);
    }
    ctx.store = std::make_shared<StoreClient>(host, port, deadline, opts.secret);
  }
  // The wire-up's waits watch for failed ranks; the calls afterwards have the failure polls.
  const std::shared_ptr<KeyValueStore> plain = ctx.store;
  ctx.store = std::make_shared<WireupStore>(plain, opts.rank, opts.size);
  struct Restore {
    CommContext& ctx;
    std::shared_ptr<KeyValueStore> plain;
    ~Restore() { ctx.store = plain; }
  } restore{ctx, plain};
  KeyValueStore& store = *ctx.store;
  store.hello(opts.rank, deadline);
  char hostname[256] = "?";
  gethostname(hostname, sizeof hostname - 1);
  store.set(ctx.key("host/" + std::to_string(opts.rank)),
            "host " + std::string(hostname) + ", pid " + std::to_string(getpid()), deadline);
  calls.check_versions(deadline);
  liveness.start(deadline);  // beats only when opts.heartbeat > 0
  if (opts.host_store) store.set(ctx.key("store_host"), std::to_string(opts.rank), deadline);
  endpoints.connect(*algorithms, deadline);
  // Every rank published its UCX address after this key: it is there by now.
  if (auto h = store.try_get(ctx.key("store_host"), deadline)) ctx.store_host_rank = std::atoi(h->c_str());
  ctx.store_barrier("connected", deadline);
}

}  // namespace tandem
