// tandem._c10d: a torch.distributed process group whose collectives run on a
// tandem communicator, so `init_process_group("tandem")` and an unmodified
// DistributedDataParallel use tandem (tandem/c10d.py registers the backend).
//
// Terms. A *work* is c10d's handle of one call. Collectives are issued at
// once (async) on the calling thread; one *completer* thread per process
// group waits for them in issue order, copies results where a call needed a
// staging buffer (non-contiguous tensors, allgather into a tensor list), then
// completes the work and its future, which is what DDP's reducer waits on.
// Sends and receives start when first needed (CallHandle, c10d_call.h): run
// by the wait() that follows them, or started by the next call; a second
// completer finishes them in whatever order they finish.
// The communicator bootstraps through the c10d store the group is handed
// (C10dStore below), as ProcessGroupGloo does: no store or port of its own.
// Built against Debian's libtorch-dev and python3-torch (1.13): CPU tensors only.
#include <torch/extension.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "c10d_store.h"
#include "c10d_tensors.h"
#include "c10d_work.h"
#include "tandem/tandem.h"

namespace {

namespace py = pybind11;
using tandem::c10d_backend::C10dStore;
using tandem::c10d_backend::CallHandle;
using tandem::c10d_backend::Completer;
using tandem::c10d_backend::TandemWork;
using namespace tandem::c10d_backend;

class ProcessGroupTandem : public c10d::ProcessGroup {
 public:
  ProcessGroupTandem(int rank, int size, std::unique_ptr<tandem::Communicator> comm)
      : c10d::ProcessGroup(rank, size), comm_(std::move(comm)), completer_(std::make_unique<Completer>()) {}

  const std::string getBackendName() const override { return "tandem"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    at::Tensor t = single(tensors, "allreduce");
    TORCH_CHECK(t.scalar_type() != at::kBool, "tandem backend: allreduce of bool tensors is not supported");
    if (t.is_sparse()) return sparse_allreduce(t, opts);
    at::Tensor data = t.is_contiguous() ? t : t.contiguous();
    auto request = comm().allreduce_async(data.data_ptr(), data.data_ptr(), size_t(data.numel()), to_tandem(data),
                                          to_tandem(opts.reduceOp), with_timeout(opts.timeout));
    return issue(std::move(request), c10d::OpType::ALLREDUCE, {t}, copy_back(t, data));
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "tandem backend: allreduce_coalesced of no tensors");
    for (const auto& t : tensors) check_cpu(t, "allreduce_coalesced");
    at::Tensor flat = torch::cat(flatten_all(tensors));
    auto request = comm().allreduce_async(flat.data_ptr(), flat.data_ptr(), size_t(flat.numel()), to_tandem(flat),
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
    auto request = comm().broadcast_async(data.data_ptr(), data.data_ptr(), bytes_as_count(data), byte_type(data),
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
    auto request = comm().allgather_async(in.data_ptr(), flat.data_ptr(), bytes_as_count(in), byte_type(in),
                                          with_timeout(opts.timeout));
    std::vector<at::Tensor> list = outputs[0];
    auto after = [list, flat, n = in.numel()]() mutable {
      for (size_t r = 0; r < list.size(); ++r) list[r].view({-1}).copy_(flat.narrow(0, int64_t(r) * n, n));
    };
    return issue(std::move(request), c10d::OpType::ALLGATHER, list, after, inputs);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    check_cpu(input, "_allgather_base");
    check_cpu(output, "_allgather_base");
    TORCH_CHECK(output.is_contiguous() && output.numel() == input.numel() * getSize() &&
                    output.scalar_type() == input.scalar_type(),
                "tandem backend: _allgather_base needs a contiguous output of world size x the input");
    at::Tensor in = input.contiguous();
    auto request = comm().allgather_async(in.data_ptr(), output.data_ptr(), bytes_as_count(in), byte_type(in),
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
    auto request = comm().reduce_scatter_async(in.data_ptr(), output.data_ptr(), size_t(output.numel()), to_tandem(in),
                                               to_tandem(opts.reduceOp), with_timeout(opts.timeout));
    return issue(std::move(request), c10d::OpType::_REDUCE_SCATTER_BASE, {output}, [in] {});
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    at::Tensor t = single(tensors, "reduce");
    TORCH_CHECK(t.scalar_type() != at::kBool, "tandem backend: reduce of bool tensors is not supported");
    at::Tensor data = t.is_contiguous() ? t : t.contiguous();
    auto request = comm().reduce_async(data.data_ptr(), data.data_ptr(), size_t(data.numel()), to_tandem(data),
                                       to_tandem(opts.reduceOp), int(opts.rootRank), with_timeout(opts.timeout));
    return issue(std::move(request), c10d::OpType::REDUCE, {t}, copy_back(t, data));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    at::Tensor out = single(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 && int(inputs[0].size()) == getSize(),
                "tandem backend: reduce_scatter needs one list of ", getSize(), " input tensors");
    TORCH_CHECK(out.scalar_type() != at::kBool, "tandem backend: reduce_scatter of bool tensors is not supported");
    tandem::Blocks blocks;
    for (const auto& t : inputs[0]) blocks.counts.push_back(size_t(t.numel()));
    at::Tensor flat = torch::cat(flatten_all(inputs[0]));
    at::Tensor staged = out.is_contiguous() ? out : out.contiguous();
    auto request = comm().reduce_scatterv_async(flat.data_ptr(), staged.data_ptr(), blocks, to_tandem(flat),
                                                to_tandem(opts.reduceOp), with_timeout(opts.timeout));
    auto back = copy_back(out, staged);
    return issue(std::move(request), c10d::OpType::REDUCE_SCATTER, {out}, [flat, back] {
      if (back) back();
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    TORCH_CHECK(!inputs.empty() && int(output_lists.size()) == getSize(), "tandem backend: allgather_coalesced needs ",
                getSize(), " output lists, one per rank");
    for (const auto& t : inputs) check_cpu(t, "allgather_coalesced");
    at::Tensor flat = torch::cat(flatten_bytes(inputs));
    at::Tensor gathered = at::empty({int64_t(getSize()) * flat.numel()}, flat.options());
    auto request = comm().allgather_async(flat.data_ptr(), gathered.data_ptr(), size_t(flat.numel()),
                                          tandem::DataType::u8, with_timeout(opts.timeout));
    std::vector<at::Tensor> outputs;
    for (const auto& list : output_lists) outputs.insert(outputs.end(), list.begin(), list.end());
    auto after = [output_lists, flat, gathered, per_rank = flat.numel()]() mutable {
      for (size_t r = 0; r < output_lists.size(); ++r)
        unflatten_bytes(gathered.narrow(0, int64_t(r) * per_rank, per_rank), output_lists[r]);
    };
    return issue(std::move(request), c10d::OpType::ALLGATHER_COALESCED, outputs, after, inputs);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    at::Tensor in = single(inputs, "gather").contiguous();
    const int root = int(opts.rootRank);
    const bool is_root = getRank() == root;
    if (is_root) {
      TORCH_CHECK(outputs.size() == 1 && int(outputs[0].size()) == getSize(),
                  "tandem backend: gather needs one list of ", getSize(), " output tensors on the root");
      for (const auto& o : outputs[0]) {
        TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                    "tandem backend: gather outputs must match the input's size and dtype");
      }
    } else {
      TORCH_CHECK(outputs.empty(), "tandem backend: gather takes output tensors on the root only");
    }
    at::Tensor flat = at::empty({is_root ? int64_t(getSize()) * in.numel() : 0}, in.options());
    auto request = comm().gather_async(in.data_ptr(), flat.data_ptr(), bytes_as_count(in), byte_type(in), root,
                                       with_timeout(opts.timeout));
    std::vector<at::Tensor> list = is_root ? outputs[0] : std::vector<at::Tensor>{};
    auto after = [list, flat, in, n = in.numel()]() mutable {
      for (size_t r = 0; r < list.size(); ++r) list[r].view({-1}).copy_(flat.narrow(0, int64_t(r) * n, n));
    };
    return issue(std::move(request), c10d::OpType::GATHER, list, after, inputs);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    at::Tensor out = single(outputs, "scatter");
    const int root = int(opts.rootRank);
    at::Tensor flat = at::empty({0}, out.options());
    if (getRank() == root) {
      TORCH_CHECK(inputs.size() == 1 && int(inputs[0].size()) == getSize(),
                  "tandem backend: scatter needs one list of ", getSize(), " input tensors on the root");
      for (const auto& i : inputs[0]) {
        TORCH_CHECK(i.numel() == out.numel() && i.scalar_type() == out.scalar_type(),
                    "tandem backend: scatter inputs must match the output's size and dtype");
      }
      flat = torch::cat(flatten_all(inputs[0]));
    } else {
      TORCH_CHECK(inputs.empty(), "tandem backend: scatter takes input tensors on the root only");
    }
    at::Tensor staged = out.is_contiguous() ? out : out.contiguous();
    auto request = comm().scatter_async(flat.data_ptr(), staged.data_ptr(), bytes_as_count(staged), byte_type(staged),
                                        root, with_timeout(opts.timeout));
    auto back = copy_back(out, staged);
    return issue(std::move(request), c10d::OpType::SCATTER, {out}, [flat, back] {
      if (back) back();
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    check_cpu(input, "alltoall_base");
    check_cpu(output, "alltoall_base");
    TORCH_CHECK(output.is_contiguous() && output.scalar_type() == input.scalar_type(),
                "tandem backend: alltoall_base needs a contiguous output of the input's dtype");
    at::Tensor in = input.contiguous();
    const tandem::Blocks send = split_blocks(in, input_splits, "input"),
                         recv = split_blocks(output, output_splits, "output");
    auto request = comm().alltoallv_async(in.data_ptr(), send, output.data_ptr(), recv, tandem::DataType::u8,
                                          with_timeout(opts.timeout));
    return issue(std::move(request), c10d::OpType::ALLTOALL_BASE, {output}, [in] {});
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    TORCH_CHECK(int(outputs.size()) == getSize() && int(inputs.size()) == getSize(), "tandem backend: alltoall needs ",
                getSize(), " input and ", getSize(), " output tensors");
    tandem::Blocks send, recv;
    for (const auto& t : inputs) send.counts.push_back(bytes_as_count(t));
    for (const auto& t : outputs) recv.counts.push_back(bytes_as_count(t));
    at::Tensor flat_in = torch::cat(flatten_bytes(inputs));
    at::Tensor flat_out =
        at::empty({int64_t(std::accumulate(recv.counts.begin(), recv.counts.end(), size_t(0)))}, flat_in.options());
    auto request = comm().alltoallv_async(flat_in.data_ptr(), send, flat_out.data_ptr(), recv, tandem::DataType::u8,
                                          with_timeout(opts.timeout));
    auto after = [outputs, flat_in, flat_out]() mutable { unflatten_bytes(flat_out, outputs); };
    return issue(std::move(request), c10d::OpType::ALLTOALL, outputs, after);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    at::Tensor data = single(tensors, "send").contiguous();
    check_peer(dst, tag, "send to");
    auto call =
        defer({tandem::P2POp::send, data.data_ptr(), bytes_as_count(data), tandem::DataType::u8, dst, uint32_t(tag)});
    return issue_p2p(std::move(call), c10d::OpType::SEND, {tensors[0]}, [data] {});
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return receive(tensors, src, tag, c10d::OpType::RECV);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return receive(tensors, tandem::kAnySource, tag, c10d::OpType::RECVANYSOURCE);
  }

  // batch_isend_irecv's bracket: the sends and receives between are one group call.
  void startCoalescing() override {
    std::lock_guard<std::mutex> lock(deferred_mutex_);
    coalescing_ = true;
    batch_.reset();
  }
  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>& /*reqs*/) override {
    std::lock_guard<std::mutex> lock(deferred_mutex_);
    coalescing_ = false;
    batch_.reset();
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return issue(comm().barrier_async(with_timeout(opts.timeout)), c10d::OpType::BARRIER, {}, nullptr);
  }

  // Gloo's monitored barrier: rank 0 hears from every rank within the
  // timeout, then releases them; a rank that does not answer is named
  // ("Rank 2 failed to pass monitoredBarrier in 2000 ms"), every silent one
  // with wait_all_ranks. Its messages use the one tag torch's never reach.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    constexpr uint32_t kTag = INT32_MAX;
    const tandem::CollectiveOptions o = with_timeout(opts.timeout);
    const auto timeout = o.timeout.value_or(comm_->options().timeout);
    uint8_t token = 0;
    if (getRank() != 0) {
      comm().send(&token, 1, tandem::DataType::u8, 0, kTag, o);
      try {
        comm().recv(&token, 1, tandem::DataType::u8, 0, kTag, o);
      } catch (const std::exception& e) {
        TORCH_CHECK(false, "Rank ", getRank(),
                    " successfully reached monitoredBarrier, but received errors while "
                    "waiting for send/recv from rank 0: ",
                    e.what());
      }
      return;
    }
    std::vector<uint8_t> tokens(static_cast<size_t>(getSize()));
    std::vector<tandem::Request> arrivals;
    for (int r = 1; r < getSize(); ++r) {
      arrivals.push_back(comm().recv_async(&tokens[size_t(r)], 1, tandem::DataType::u8, r, kTag, o));
    }
    std::string silent;
    int count = 0;
    // A timeout spent before any rank could answer is rank 0's own (Gloo's text).
    TORCH_CHECK(timeout.count() > 0, "Rank 0 timed out in monitoredBarrier after 0 ms");
    for (int r = 1; r < getSize(); ++r) {
      try {
        arrivals[size_t(r - 1)].wait();
      } catch (const std::exception&) {
        silent += (count++ ? ", " : "") + std::to_string(r);
        if (!wait_all_ranks) break;
      }
    }
    TORCH_CHECK(count == 0, count == 1 ? "Rank " : "Ranks ", silent, " failed to pass monitoredBarrier in ",
                timeout.count(), " ms");
    for (int r = 1; r < getSize(); ++r) comm().send(&token, 1, tandem::DataType::u8, r, kTag, o);
  }

 private:
  // A sparse (COO) all-reduce, as Gloo's: every rank's indices and values are
  // gathered and summed by coalescing. Blocking; the work is complete on return.
  c10::intrusive_ptr<c10d::Work> sparse_allreduce(at::Tensor& t, const c10d::AllreduceOptions& opts) {
    TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM, "tandem backend: sparse allreduce supports SUM only");
    const auto o = with_timeout(opts.timeout);
    const at::Tensor input = t.coalesce();
    const at::Tensor indices = input._indices().contiguous(), values = input._values().contiguous();
    const int64_t nnz = input._nnz(), sparse_dim = indices.size(0), per_entry = nnz ? values.numel() / nnz : 0;
    std::vector<int64_t> all_nnz(static_cast<size_t>(getSize()));
    comm().allgather(&nnz, all_nnz.data(), 1, tandem::DataType::i64, o);
    int64_t width = per_entry;  // elements of one value entry: the same on every rank
    comm().allreduce(&width, 1, tandem::DataType::i64, tandem::ReduceOp::max, o);
    // Indices travel transposed (one row of sparse_dim per entry), values as bytes.
    tandem::Blocks index_blocks, value_blocks;
    for (int64_t k : all_nnz) {
      index_blocks.counts.push_back(size_t(k * sparse_dim));
      value_blocks.counts.push_back(size_t(k * width) * values.element_size());
    }
    const int64_t total = std::accumulate(all_nnz.begin(), all_nnz.end(), int64_t(0));
    at::Tensor my_indices = indices.t().contiguous();
    at::Tensor gathered_indices = at::empty({total, sparse_dim}, indices.options());
    comm().allgatherv(my_indices.data_ptr(), size_t(nnz * sparse_dim), gathered_indices.data_ptr(), index_blocks,
                      tandem::DataType::i64, o);
    std::vector<int64_t> value_shape = values.sizes().vec();
    value_shape[0] = total;
    at::Tensor gathered_values = at::empty(value_shape, values.options());
    comm().allgatherv(values.data_ptr(), bytes_as_count(values), gathered_values.data_ptr(), value_blocks,
                      tandem::DataType::u8, o);
    at::Tensor result =
        at::sparse_coo_tensor(gathered_indices.t(), gathered_values, input.sizes(), input.options()).coalesce();
    t.copy_(result);
    auto work = c10::make_intrusive<TandemWork>(getRank(), c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{result});
    work->complete(nullptr);
    return work;
  }

  // alltoall_base's split sizes (rows of dimension 0; empty: equal) as byte blocks.
  tandem::Blocks split_blocks(const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) const {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const size_t row_bytes = rows == 0 ? 0 : bytes_as_count(t) / size_t(rows);
    tandem::Blocks b;
    if (splits.empty()) {
      TORCH_CHECK(rows % getSize() == 0, "tandem backend: alltoall_base ", which, " has ", rows,
                  " rows, not divisible by world size ", getSize(), "; pass split sizes");
      b.counts.assign(size_t(getSize()), size_t(rows / getSize()) * row_bytes);
      return b;
    }
    TORCH_CHECK(int(splits.size()) == getSize(), "tandem backend: alltoall_base needs ", getSize(), " ", which,
                " split sizes (got ", splits.size(), ")");
    int64_t total = 0;
    for (int64_t s : splits) {
      TORCH_CHECK(s >= 0, "tandem backend: alltoall_base ", which, " split sizes must be >= 0");
      b.counts.push_back(size_t(s) * row_bytes);
      total += s;
    }
    TORCH_CHECK(total == rows, "tandem backend: alltoall_base ", which, " split sizes sum to ", total,
                " but the tensor has ", rows, " rows");
    return b;
  }

  c10::intrusive_ptr<c10d::Work> receive(std::vector<at::Tensor>& tensors, int src, int tag, c10d::OpType type) {
    at::Tensor t = single(tensors, type == c10d::OpType::RECV ? "recv" : "recvAnysource");
    at::Tensor data = t.is_contiguous() ? t : t.contiguous();
    if (src != tandem::kAnySource) check_peer(src, tag, "recv from");
    auto call =
        defer({tandem::P2POp::recv, data.data_ptr(), bytes_as_count(data), tandem::DataType::u8, src, uint32_t(tag)});
    return issue_p2p(std::move(call), type, {t}, copy_back(t, data));
  }

  void check_peer(int peer, int tag, const char* what) const {
    TORCH_CHECK(peer >= 0 && peer < getSize(), "tandem backend: ", what, " rank ", peer,
                ", which is out of range for world size ", getSize());
    TORCH_CHECK(tag >= 0, "tandem backend: tag ", tag, " is negative; tags are 0..2^31-1");
  }

  // A send or receive, started when first needed (CallHandle); within a
  // batch_isend_irecv (startCoalescing .. endCoalescing), one group call with
  // the batch's other ops.
  std::shared_ptr<CallHandle> defer(const tandem::P2POp& op) {
    std::lock_guard<std::mutex> lock(deferred_mutex_);
    if (batch_ && batch_->add(op)) return batch_;
    if (deferred_) deferred_->start();  // issue order: what came before starts first
    deferred_ = std::make_shared<CallHandle>(*comm_, std::vector<tandem::P2POp>{op});
    if (coalescing_) batch_ = deferred_;
    return deferred_;
  }

  // The communicator, for a call issued now: a deferred one issued before starts first.
  tandem::Communicator& comm() {
    std::lock_guard<std::mutex> lock(deferred_mutex_);
    if (deferred_) deferred_->start();
    deferred_.reset();
    batch_.reset();
    return *comm_;
  }

  c10::intrusive_ptr<c10d::Work> issue_p2p(std::shared_ptr<CallHandle> call, c10d::OpType type,
                                           std::vector<at::Tensor> outputs, std::function<void()> after) {
    auto work = c10::make_intrusive<TandemWork>(getRank(), type, outputs, outputs, std::move(call), std::move(after));
    p2p_completer_->submit(work);
    return work;
  }

  // `inputs`: what the profiler records as the call's shapes (default: the outputs).
  c10::intrusive_ptr<c10d::Work> issue(tandem::Request request, c10d::OpType type, std::vector<at::Tensor> outputs,
                                       std::function<void()> after,
                                       c10::optional<std::vector<at::Tensor>> inputs = c10::nullopt) {
    auto work = c10::make_intrusive<TandemWork>(getRank(), type, outputs, inputs ? inputs : outputs,
                                                std::make_shared<CallHandle>(std::move(request)), std::move(after));
    completer_->submit(work);
    return work;
  }

  std::unique_ptr<tandem::Communicator> comm_;
  // Declared after comm_, so destroyed first: every issued call completes (or
  // fails by its deadline) before the communicator goes.
  std::unique_ptr<Completer> completer_;
  std::unique_ptr<Completer> p2p_completer_ = std::make_unique<Completer>(Completer::Order::completion);
  std::mutex deferred_mutex_;
  std::shared_ptr<CallHandle> deferred_;  // the last send or receive issued, if it may be unstarted
  std::shared_ptr<CallHandle> batch_;     // the open batch_isend_irecv's call
  bool coalescing_ = false;
};

// The communicator behind a process group, bootstrapped through the group's c10d store.
c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                              double timeout_s) {
  TORCH_CHECK(store, "tandem backend: no c10d store was handed to the process group");
  tandem::CommOptions o;
  try {
    o = tandem::comm_options_from_env();  // TANDEM_* tuning knobs, when a launcher set them
  } catch (const std::exception&) {
    // Not under tandem launch (e.g. torchrun): the tuning knobs alone, with what c10d handed us below.
    o = tandem::tuning_from_env();
  }
  o.rank = rank, o.size = size;
  o.store = std::make_shared<C10dStore>(store, size);  // never tandem's store: store_address and secret go unused
  o.prefix = "tandem";                                 // within the group's PrefixStore, apart from c10d's own keys
  o.timeout = std::chrono::milliseconds(int64_t(timeout_s * 1e3));
  const tandem::ring::RingOptions ring_options = tandem::ring::ring_options_from_env();  // TANDEM_ALGO, TANDEM_SHM, ...
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
