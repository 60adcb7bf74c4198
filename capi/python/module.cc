// tandem._tandem: the C++ API for Python. Buffers arrive as (address, count,
// dtype) so NumPy arrays and torch tensors alike are used in place (the
// package's Python layer takes the addresses); blocking calls drop the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "tandem/fusion/gradient_sync.h"
#include "tandem/tandem.h"

namespace py = pybind11;
using namespace tandem;

namespace {

void* ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

CollectiveOptions collective(std::optional<double> timeout_s) {
  CollectiveOptions o;
  if (timeout_s) o.timeout = std::chrono::milliseconds(int64_t(*timeout_s * 1e3));
  return o;
}

Deadline deadline_in(const Communicator& c, std::optional<double> timeout_s) {
  return Clock::now() + (timeout_s ? std::chrono::milliseconds(int64_t(*timeout_s * 1e3)) : c.options().timeout);
}

// A Call as Python builds it: addresses as integers, the arrays owned here,
// and the lengths of the buffers it came with, from which the count follows
// (fit_count, by the table's row).
struct PyCall {
  Op op = Op::barrier;
  uintptr_t input = 0, output = 0;
  size_t input_elements = 0, output_elements = 0;
  DataType dtype = DataType::f32;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0, peer = 0;
  uint32_t tag = 0;
  Blocks send, recv;
  // (is_send, address, count, dtype, peer, tag)
  std::vector<std::tuple<bool, uintptr_t, size_t, DataType, int, uint32_t>> group;
  std::optional<double> timeout;
  std::vector<P2POp> messages;  // group, converted

  Call to_call(const Communicator& c) {
    Call call{.op = op,
              .input = ptr(input),
              .output = ptr(output),
              .dtype = dtype,
              .reduce = reduce,
              .root = root,
              .peer = peer,
              .tag = tag,
              .send = send,
              .recv = recv,
              .options = collective(timeout)};
    messages.clear();
    for (const auto& [is_send, address, count, type, to, t] : group) {
      messages.push_back({is_send ? P2POp::send : P2POp::recv, ptr(address), count, type, to, t});
    }
    call.group = messages;
    fit_count(call, input_elements, output_elements, c.rank(), c.size());
    return call;
  }
};

// The table of operations, for the Python package to build its methods from.
py::list operation_table() {
  py::list rows;
  for (const OpInfo& o : operations()) {
    py::dict d;
    d["name"] = o.name, d["op"] = o.op, d["params"] = o.params, d["summary"] = o.summary;
    d["input"] = o.input != Extent::none, d["output"] = o.output != Extent::none;
    d["output_defaults_to_input"] = o.output_defaults_to_input;
    d["recv_blocks"] = (o.fields & kFieldRecv) != 0, d["send_blocks"] = (o.fields & kFieldSend) != 0;
    rows.append(d);
  }
  return rows;
}

// The gradient sync keeps its communicator alive.
struct PyGradientSync {
  std::shared_ptr<Communicator> comm;
  std::unique_ptr<fusion::GradientSync> sync;
};

// Errors, element types, reduce ops, requests.
void bind_types(py::module_& m) {
  auto error = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<InvalidArgument>(m, "InvalidArgument", error.ptr());
  py::register_exception<Timeout>(m, "Timeout", error.ptr());
  py::register_exception<PeerFailure>(m, "PeerFailure", error.ptr());
  auto aborted = py::register_exception<Aborted>(m, "Aborted", error.ptr());
  auto revoked = py::register_exception<Revoked>(m, "Revoked", aborted.ptr());
  py::register_exception<Excluded>(m, "Excluded", revoked.ptr());

  py::enum_<DataType>(m, "DataType")
      .value("f32", DataType::f32)
      .value("f64", DataType::f64)
      .value("f16", DataType::f16)
      .value("bf16", DataType::bf16)
      .value("i32", DataType::i32)
      .value("i64", DataType::i64)
      .value("u8", DataType::u8);
  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("sum", ReduceOp::sum)
      .value("avg", ReduceOp::avg)
      .value("min", ReduceOp::min)
      .value("max", ReduceOp::max)
      .value("prod", ReduceOp::prod);

  py::class_<Request>(m, "Request")
      .def("test", &Request::test, py::call_guard<py::gil_scoped_release>(),
           "True once finished; raises the collective's error")
      .def(
          "wait",
          [](Request& r, std::optional<double> timeout_s) {
            if (timeout_s)
              r.wait(Clock::now() + std::chrono::milliseconds(int64_t(*timeout_s * 1e3)));
            else
              r.wait();
          },
          py::arg("timeout") = py::none(), py::call_guard<py::gil_scoped_release>(),
          "Waits (seconds; None: the collective's own deadline); Timeout leaves it running")
      .def_property_readonly("source", &Request::source,
                             "The rank a finished receive came from (the sender for ANY_SOURCE); else -1");
  m.attr("ANY_SOURCE") = kAnySource;
  m.attr("UNDEFINED_COLOR") = kUndefinedColor;
}

// The table of operations and the Call every one of them is.
void bind_operations(py::module_& m) {
  py::enum_<Op> op(m, "Op");
  for (const OpInfo& o : operations()) op.value(o.name, o.op);
  m.def("operations", &operation_table, "The table of operations: one dict per operation, in order");
  py::class_<PyCall>(m, "Call")
      .def(py::init<>())
      .def_readwrite("op", &PyCall::op)
      .def_readwrite("input", &PyCall::input)
      .def_readwrite("output", &PyCall::output)
      .def_readwrite("input_elements", &PyCall::input_elements)
      .def_readwrite("output_elements", &PyCall::output_elements)
      .def_readwrite("dtype", &PyCall::dtype)
      .def_readwrite("reduce", &PyCall::reduce)
      .def_readwrite("root", &PyCall::root)
      .def_readwrite("peer", &PyCall::peer)
      .def_readwrite("tag", &PyCall::tag)
      .def_property(
          "send", [](const PyCall& c) { return std::make_pair(c.send.counts, c.send.displs); },
          [](PyCall& c, std::pair<std::vector<size_t>, std::vector<size_t>> b) {
            c.send = {b.first, b.second};
          })
      .def_property(
          "recv", [](const PyCall& c) { return std::make_pair(c.recv.counts, c.recv.displs); },
          [](PyCall& c, std::pair<std::vector<size_t>, std::vector<size_t>> b) {
            c.recv = {b.first, b.second};
          })
      .def_readwrite("group", &PyCall::group)
      .def_readwrite("timeout", &PyCall::timeout);
}

// Communicators: created, split, and every operation through start and run.
void bind_communicator(py::module_& m) {
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def_static(
          "from_env", [] { return std::shared_ptr<Communicator>(ring::connect_from_env()); },
          py::call_guard<py::gil_scoped_release>(), "Rank, size and store from tandem launch, mpirun or srun")
      .def_static(
          "create",
          [](int rank, int size, const std::string& store, bool host_store, double timeout_s, bool shared_memory,
             const std::string& prefix) {
            CommOptions o;
            o.rank = rank, o.size = size, o.store_address = store, o.host_store = host_store;
            o.timeout = std::chrono::milliseconds(int64_t(timeout_s * 1e3));
            ring::RingOptions ro;
            ro.shared_memory = shared_memory;
            o.prefix = prefix;
            return std::shared_ptr<Communicator>(ring::connect(o, ro));
          },
          py::arg("rank"), py::arg("size"), py::arg("store"), py::arg("host_store") = false, py::arg("timeout") = 300.0,
          py::arg("shared_memory") = true, py::arg("prefix") = "tandem", py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("transport", &Communicator::transport_summary)
      .def(
          "start", [](Communicator& c, PyCall& call) { return c.start(call.to_call(c)); }, nogil,
          "Starts the call; the Request finishes when it has")
      .def(
          "run", [](Communicator& c, PyCall& call) { return c.run(call.to_call(c)); }, nogil,
          "Runs the call; returns a receive's source, else -1")
      .def(
          "split",
          [](Communicator& c, int color, int key, std::optional<double> timeout) {
            return std::shared_ptr<Communicator>(c.split(color, key, collective(timeout)));
          },
          py::arg("color"), py::arg("key"), py::arg("timeout") = py::none(), nogil,
          "Ranks of one colour form a new communicator ordered by key (UNDEFINED_COLOR: None)")
      .def(
          "duplicate",
          [](Communicator& c, std::optional<double> timeout) {
            return std::shared_ptr<Communicator>(c.duplicate(collective(timeout)));
          },
          py::arg("timeout") = py::none(), nogil, "The same ranks, a communicator of their own")
      .def(
          "shrink",
          [](Communicator& c, const std::vector<int>& exclude, std::optional<double> timeout) {
            Communicator::Shrunk shrunk = c.shrink(exclude, collective(timeout));
            return std::make_pair(std::shared_ptr<Communicator>(std::move(shrunk.comm)), shrunk.members);
          },
          py::arg("exclude") = std::vector<int>{}, py::arg("timeout") = py::none(), nogil,
          "Revokes; the survivors agree on the members; (their communicator, this one's ranks in its order)")
      .def(
          "grow",
          [](Communicator& c, std::optional<int> max_new, std::optional<double> timeout) {
            Communicator::Grown grown = c.grow(max_new.value_or(std::numeric_limits<int>::max()), collective(timeout));
            return std::make_pair(std::shared_ptr<Communicator>(std::move(grown.comm)), grown.joined);
          },
          py::arg("max_new") = py::none(), py::arg("timeout") = py::none(), nogil,
          "Admits the processes waiting to join (TANDEM_JOIN=1); (their communicator or None, how many joined)")
      .def(
          "joiners_waiting",
          [](Communicator& c, std::optional<double> timeout) { return c.joiners_waiting(collective(timeout)); },
          py::arg("timeout") = py::none(), nogil,
          "How many processes wait to join (this rank alone asks the store; share it before grow())")
      .def_property_readonly("joined", &Communicator::joined)
      .def("_allocate_shared", [](Communicator& c, size_t bytes) { return uintptr_t(c.allocate_shared(bytes)); })
      .def("_free_shared", [](Communicator& c, uintptr_t p) { c.free_shared(ptr(p)); })
      .def("abort", &Communicator::abort, py::arg("reason") = "abort() called",
           "Unblocks every pending and later call with Aborted (sticky); any thread")
      .def_property_readonly("aborted", &Communicator::aborted)
      .def("revoke", &Communicator::revoke, py::arg("reason") = "revoke() called",
           "abort() on every rank: their pending and later calls fail with Revoked",
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("revoked", &Communicator::revoked);
}

// The gradient sync over a communicator.
void bind_gradient_sync(py::module_& m) {
  py::class_<PyGradientSync>(m, "_GradientSync")
      .def(py::init([](std::shared_ptr<Communicator> comm, size_t threshold, size_t first_bucket, bool average,
                       int aggregation_frequency, bool average_aggregated, bool allow_unused, int metric_slots) {
        fusion::GradientSyncOptions o;
        o.fusion.fusion_threshold_bytes = threshold;
        o.fusion.first_bucket_bytes = first_bucket;
        o.average = average;
        o.aggregation_frequency = aggregation_frequency;
        o.average_aggregated_gradients = average_aggregated;
        o.allow_unused = allow_unused;
        o.metric_slots = metric_slots;
        auto s = std::make_unique<PyGradientSync>();
        s->sync = std::make_unique<fusion::GradientSync>(*comm, o);
        s->comm = std::move(comm);
        return s;
      }))
      .def("register", [](PyGradientSync& s, const std::string& name, size_t count,
                          DataType t) { return s.sync->register_gradient(name, count, t); })
      .def("register_external", [](PyGradientSync& s, const std::string& name, uintptr_t data, size_t count,
                                   DataType t) { return s.sync->register_external(name, ptr(data), count, t); })
      .def(
          "finalize",
          [](PyGradientSync& s, std::optional<double> timeout) { s.sync->finalize(deadline_in(*s.comm, timeout)); },
          py::arg("timeout") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def("_data", [](PyGradientSync& s, int id) { return uintptr_t(s.sync->data(id)); })
      .def(
          "mark_ready", [](PyGradientSync& s, int id) { s.sync->mark_ready(id); },
          "This step's gradient id is in place; lock-free, from any thread (autograd hooks)")
      .def("report_metrics",
           [](PyGradientSync& s, const std::vector<std::pair<double, double>>& metrics) {
             std::vector<fusion::Metric> m;
             for (auto [sum, count] : metrics) m.push_back({sum, count});
             s.sync->report_metrics(m);
           })
      .def("metrics",
           [](PyGradientSync& s) {
             std::vector<std::pair<double, double>> out;
             for (const auto& m : s.sync->metrics()) out.emplace_back(m.sum, m.count);
             return out;
           })
      .def(
          "wait", [](PyGradientSync& s, std::optional<double> timeout) { s.sync->wait(deadline_in(*s.comm, timeout)); },
          py::arg("timeout") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def("zero", [](PyGradientSync& s) { s.sync->zero_gradients(); })
      .def("last_step", [](PyGradientSync& s) {
        const auto& st = s.sync->last_step();
        py::dict d;
        d["step"] = st.step, d["communicated"] = st.communicated, d["compute"] = st.compute;
        d["communication"] = st.communication, d["exposed"] = st.exposed, d["hidden_fraction"] = st.hidden_fraction;
        d["bytes_reduced"] = st.bytes_reduced, d["wire_bytes"] = st.wire_bytes, d["buckets"] = st.buckets;
        return d;
      });
}

}  // namespace

PYBIND11_MODULE(_tandem, m) {
  m.doc() = "tandem: collective communication for data-parallel training (C++ core)";
  m.attr("__version__") = TANDEM_VERSION_STRING;

  bind_types(m);
  bind_operations(m);
  bind_communicator(m);
  bind_gradient_sync(m);
}
