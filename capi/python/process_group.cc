// tandem._c10d: a torch.distributed process group whose collectives run on a
// tandem communicator, so `init_process_group("tandem")` and an unmodified
// DistributedDataParallel use tandem (tandem/c10d.py registers the backend).
//
// Terms. A *work* is c10d's handle of one call. tandem calls are issued at
// once (async) on the calling thread; one *completer* thread per process
// group waits for them in issue order, copies results where a call needed a
// staging buffer (non-contiguous tensors, allgather into a tensor list), then
// completes the work and its future, which is what DDP's reducer waits on.
// The communicator bootstraps through the c10d store the group is handed
// (C10dStore below), as ProcessGroupGloo does: no store or port of its own.
// Built against Debian's libtorch-dev and python3-torch (1.13): CPU tensors only.
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "tandem/store.h"
#include "tandem/tandem.h"

namespace {

namespace py = pybind11;

tandem::DataType to_tandem(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return tandem::DataType::f32;
    case at::kDouble: return tandem::DataType::f64;
    case at::kHalf: return tandem::DataType::f16;
    case at::kBFloat16: return tandem::DataType::bf16;
    case at::kInt: return tandem::DataType::i32;
    case at::kLong: return tandem::DataType::i64;
    case at::kByte: return tandem::DataType::u8;
    case at::kBool: return tandem::DataType::u8;  // broadcast and allgather only (checked below)
    default:
      TORCH_CHECK(false, "tandem backend: tensors of ", t.scalar_type(),
                  " are not supported; use float32, float64, float16, bfloat16, int32, int64, uint8 or bool");
  }
}

tandem::ReduceOp to_tandem(const c10d::ReduceOp& op) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM: return tandem::ReduceOp::sum;
    case c10d::ReduceOp::AVG: return tandem::ReduceOp::avg;
    case c10d::ReduceOp::PRODUCT: return tandem::ReduceOp::prod;
    case c10d::ReduceOp::MIN: return tandem::ReduceOp::min;
    case c10d::ReduceOp::MAX: return tandem::ReduceOp::max;
    default:
      TORCH_CHECK(false, "tandem backend: reduce op ", int(static_cast<c10d::ReduceOp::RedOpType>(op)),
                  " is not supported; use SUM, AVG, PRODUCT, MIN or MAX");
  }
}

void check_cpu(const at::Tensor& t, const char* call) {
  TORCH_CHECK(t.device().is_cpu(), "tandem backend: ", call, " needs CPU tensors (got ", t.device(),
              "); tandem's CUDA kernels are not wired into the torch backend");
}

at::Tensor single(std::vector<at::Tensor>& tensors, const char* call) {
  TORCH_CHECK(tensors.size() == 1, "tandem backend: ", call, " takes one tensor per rank (got ", tensors.size(), ")");
  check_cpu(tensors[0], call);
  return tensors[0];
}

tandem::CollectiveOptions with_timeout(std::chrono::milliseconds timeout) {
  tandem::CollectiveOptions o;
  if (timeout != c10d::kUnsetTimeout) o.timeout = timeout;
  return o;
}

// tandem's KeyValueStore over a c10d::Store (TCPStore, FileStore, HashStore,
// each behind the group's PrefixStore). c10d's get and wait block up to the
// store's own timeout while holding the store's lock (TCPStore 1.13 serialises
// every call on one mutex), so blocking calls here poll check() instead
// (TCPStore's wait with a timeout would leave its reply in the connection),
// 1 ms apart, doubling up to world size / 10 ms (2..50 ms): the whole world
// asks the store at most ~10,000 times a second while it waits, and a small
// world does not oversleep its start-up. tandem's deadline holds, and the
// heartbeat's handle, which shares the store (connect_again), is never held
// up for long.
// TCPStore, FileStore, HashStore and PrefixStore guard each call with a
// mutex, so two threads may call them. set/add/check/deleteKey cannot be
// bounded from outside: they return when the store answers. c10d's errors
// become PeerFailure(-1) (the store is gone or broken), its timeouts Timeout.
class C10dStore final : public tandem::KeyValueStore {
 public:
  C10dStore(c10::intrusive_ptr<c10d::Store> store, int world_size)
      : store_(std::move(store)), world_size_(world_size),
        poll_max_(std::clamp(std::chrono::milliseconds(world_size / 10), std::chrono::milliseconds(2),
                             std::chrono::milliseconds(50))) {}

  void set(const std::string& key, const std::string& value, tandem::Deadline) override {
    guarded("set of key '" + key + "'", [&] { store_->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
  }
  std::string get(const std::string& key, tandem::Deadline deadline) override {
    wait({key}, deadline);
    return fetch(key);
  }
  std::optional<std::string> try_get(const std::string& key, tandem::Deadline deadline) override {
    if (!check({key}, deadline)) return std::nullopt;
    return fetch(key);
  }
  int64_t add(const std::string& key, int64_t delta, tandem::Deadline) override {
    int64_t total = 0;
    guarded("add to key '" + key + "'", [&] { total = store_->add(key, delta); });
    return total;
  }
  void wait(const std::vector<std::string>& keys, tandem::Deadline deadline) override {
    const auto start = tandem::Clock::now();
    auto pause = std::chrono::milliseconds(1);
    while (!check(keys, deadline)) {
      const auto now = tandem::Clock::now();
      if (now >= deadline) {
        throw tandem::Timeout("c10d store: wait for " + std::to_string(keys.size()) + " key(s), the first '" +
                              keys.front() + "', timed out after " +
                              std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count()) +
                              " ms (a rank never set it: it did not start, failed, or joined another group)");
      }
      std::this_thread::sleep_for(std::min<tandem::Clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, poll_max_);
    }
  }
  bool check(const std::vector<std::string>& keys, tandem::Deadline) override {
    bool all = false;
    guarded("check of key '" + (keys.empty() ? std::string() : keys.front()) + "'", [&] { all = store_->check(keys); });
    return all;
  }
  void erase(const std::string& key, tandem::Deadline) override {
    guarded("delete of key '" + key + "'", [&] { store_->deleteKey(key); });
  }
  std::unique_ptr<tandem::KeyValueStore> connect_again(tandem::Deadline) override {
    return std::make_unique<C10dStore>(store_, world_size_);
  }

 private:
  std::string fetch(const std::string& key) {
    std::vector<uint8_t> value;
    guarded("get of key '" + key + "'", [&] { value = store_->get(key); });
    return std::string(value.begin(), value.end());
  }

  template <class F>
  static void guarded(const std::string& what, F&& call) {
    try {
      call();
    } catch (const std::exception& e) {
      const std::string text = e.what();
      if (text.find("imeout") != std::string::npos || text.find("timed out") != std::string::npos) {
        throw tandem::Timeout("c10d store: " + what + " timed out: " + text);
      }
      throw tandem::PeerFailure(-1, "c10d store: " + what + " failed (the store is gone or refused it): " + text);
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int world_size_;
  std::chrono::milliseconds poll_max_;  // the longest pause between two checks
};

class TandemWork : public c10d::Work {
 public:
  TandemWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type), outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Completes the work: the error, or the outputs.
  void complete(std::exception_ptr error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Waits for tandem requests in issue order and completes their works.
class Completer {
 public:
  Completer() : thread_([this] { run(); }) {}
  ~Completer() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void submit(tandem::Request request, std::function<void()> after, c10::intrusive_ptr<TandemWork> work) {
    std::deque<Item> done;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(Item{std::move(request), std::move(after), std::move(work)});
      done.swap(done_);
    }
    cv_.notify_one();
  }  // `done` goes here, on a Python thread

 private:
  struct Item {
    tandem::Request request;
    std::function<void()> after;
    c10::intrusive_ptr<TandemWork> work;
  };

  void run() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        item.request.wait();  // bounded by the collective's deadline
        if (item.after) item.after();
      } catch (...) {
        error = std::current_exception();
      }
      item.work->complete(error);
      // Its tensors may own Python objects, whose release takes the GIL. Not
      // here: at interpreter exit the thread destroying the process group
      // holds the GIL while it joins this one. The next submit, or this
      // object's destructor, releases them.
      std::lock_guard<std::mutex> lock(mutex_);
      done_.push_back(std::move(item));
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::deque<Item> done_;  // completed, not yet released
  bool stopping_ = false;
  std::thread thread_;
};

class ProcessGroupTandem : public c10d::ProcessGroup {
 public:
  ProcessGroupTandem(int rank, int size, std::unique_ptr<tandem::Communicator> comm)
      : c10d::ProcessGroup(rank, size), comm_(std::move(comm)), completer_(std::make_unique<Completer>()) {}

  const std::string getBackendName() const override { return "tandem"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    at::Tensor t = single(tensors, "allreduce");
    TORCH_CHECK(t.scalar_type() != at::kBool, "tandem backend: allreduce of bool tensors is not supported");
    at::Tensor data = t.is_contiguous() ? t : t.contiguous();
    auto request = comm_->allreduce_async(data.data_ptr(), data.data_ptr(), size_t(data.numel()), to_tandem(data),
                                          to_tandem(opts.reduceOp), with_timeout(opts.timeout));
    return issue(std::move(request), c10d::OpType::ALLREDUCE, {t}, copy_back(t, data));
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "tandem backend: allreduce_coalesced of no tensors");
    for (const auto& t : tensors) check_cpu(t, "allreduce_coalesced");
    at::Tensor flat = torch::cat(flatten_all(tensors));
    auto request = comm_->allreduce_async(flat.data_ptr(), flat.data_ptr(), size_t(flat.numel()), to_tandem(flat),
                                          to_tandem(opts.reduceOp), with_timeout(opts.timeout));
    auto after = [tensors, flat]() mutable {
      int64_t offset = 0;
      for (auto& t : tensors) {
        t.view({-1}).copy_(flat.narrow(0, offset, t.numel()));
        offset += t.numel();
      }
    };
    return issue(std::move(request), c10d::OpType::ALLREDUCE_COALESCED, tensors, after);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    at::Tensor t = single(tensors, "broadcast");
    at::Tensor data = t.is_contiguous() ? t : t.contiguous();
    auto request = comm_->broadcast_async(data.data_ptr(), data.data_ptr(), bytes_as_count(data), byte_type(data),
                                          int(opts.rootRank), with_timeout(opts.timeout));
    return issue(std::move(request), c10d::OpType::BROADCAST, {t}, copy_back(t, data));
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    at::Tensor in = single(inputs, "allgather").contiguous();
    TORCH_CHECK(outputs.size() == 1 && int(outputs[0].size()) == getSize(),
                "tandem backend: allgather needs one list of ", getSize(), " output tensors");
    for (const auto& o : outputs[0]) {
      check_cpu(o, "allgather");
      TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                  "tandem backend: allgather outputs must match the input's size and dtype");
    }
    at::Tensor flat = at::empty({int64_t(getSize()) * in.numel()}, in.options());
    auto request = comm_->allgather_async(in.data_ptr(), flat.data_ptr(), bytes_as_count(in), byte_type(in),
                                          with_timeout(opts.timeout));
    std::vector<at::Tensor> list = outputs[0];
    auto after = [list, flat, n = in.numel()]() mutable {
      for (size_t r = 0; r < list.size(); ++r) list[r].view({-1}).copy_(flat.narrow(0, int64_t(r) * n, n));
    };
    return issue(std::move(request), c10d::OpType::ALLGATHER, list, after);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    check_cpu(input, "_allgather_base");
    check_cpu(output, "_allgather_base");
    TORCH_CHECK(output.is_contiguous() && output.numel() == input.numel() * getSize() &&
                    output.scalar_type() == input.scalar_type(),
                "tandem backend: _allgather_base needs a contiguous output of world size x the input");
    at::Tensor in = input.contiguous();
    auto request = comm_->allgather_async(in.data_ptr(), output.data_ptr(), bytes_as_count(in), byte_type(in),
                                          with_timeout(opts.timeout));
    return issue(std::move(request), c10d::OpType::_ALLGATHER_BASE, {output}, [in] {});
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    check_cpu(input, "_reduce_scatter_base");
    check_cpu(output, "_reduce_scatter_base");
    TORCH_CHECK(output.is_contiguous() && input.numel() == output.numel() * getSize() &&
                    output.scalar_type() == input.scalar_type(),
                "tandem backend: _reduce_scatter_base needs an input of world size x the contiguous output");
    at::Tensor in = input.contiguous();
    auto request = comm_->reduce_scatter_async(in.data_ptr(), output.data_ptr(), size_t(output.numel()),
                                               to_tandem(in), to_tandem(opts.reduceOp), with_timeout(opts.timeout));
    return issue(std::move(request), c10d::OpType::_REDUCE_SCATTER_BASE, {output}, [in] {});
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return issue(comm_->barrier_async(with_timeout(opts.timeout)), c10d::OpType::BARRIER, {}, nullptr);
  }

 private:
  // Broadcast and allgather move bytes: any dtype, bool included.
  static size_t bytes_as_count(const at::Tensor& t) { return size_t(t.numel()) * t.element_size(); }
  static tandem::DataType byte_type(const at::Tensor&) { return tandem::DataType::u8; }

  static std::vector<at::Tensor> flatten_all(const std::vector<at::Tensor>& tensors) {
    std::vector<at::Tensor> flat;
    for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
    return flat;
  }

  // A non-contiguous tensor was staged in a contiguous copy: copy the result back.
  static std::function<void()> copy_back(at::Tensor target, at::Tensor staged) {
    if (target.data_ptr() == staged.data_ptr()) return nullptr;
    return [target, staged]() mutable { target.copy_(staged); };
  }

  c10::intrusive_ptr<c10d::Work> issue(tandem::Request request, c10d::OpType type, std::vector<at::Tensor> outputs,
                                       std::function<void()> after) {
    auto work = c10::make_intrusive<TandemWork>(getRank(), type, std::move(outputs));
    completer_->submit(std::move(request), std::move(after), work);
    return work;
  }

  std::unique_ptr<tandem::Communicator> comm_;
  // Declared after comm_, so destroyed first: every issued call completes (or
  // fails by its deadline) before the communicator goes.
  std::unique_ptr<Completer> completer_;
};

// The communicator behind a process group, bootstrapped through the group's c10d store.
c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                              double timeout_s) {
  TORCH_CHECK(store, "tandem backend: no c10d store was handed to the process group");
  tandem::CommOptions o;
  try {
    o = tandem::options_from_env();  // TANDEM_* tuning knobs, when a launcher set them
  } catch (const std::exception&) {
    // Not under tandem launch (e.g. torchrun): the tuning knobs alone, with what c10d handed us below.
    o = tandem::tuning_from_env();
  }
  o.rank = rank, o.size = size;
  o.store = std::make_shared<C10dStore>(store, size);  // never tandem's store: store_address and secret go unused
  o.prefix = "tandem";  // within the group's PrefixStore, apart from c10d's own keys
  o.timeout = std::chrono::milliseconds(int64_t(timeout_s * 1e3));
  const tandem::ring::RingOptions ring_options = tandem::ring::options_from_env();  // TANDEM_ALGO, TANDEM_SHM, ...
  std::unique_ptr<tandem::Communicator> comm;
  {
    py::gil_scoped_release release;  // connecting waits for every rank
    comm = tandem::ring::connect(o, ring_options);
  }
  return c10::make_intrusive<ProcessGroupTandem>(rank, size, std::move(comm));
}

}  // namespace

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "tandem's torch.distributed process group (register it with `import tandem.c10d`)";
  py::module::import("torch.distributed");  // c10d's ProcessGroup type, which the result is returned as
  m.def("create", &create, py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"));
}
