// tandem._tandem: the C++ API for Python. Buffers arrive as (address, count,
// dtype) so NumPy arrays and torch tensors alike are used in place (the
// package's Python layer takes the addresses); blocking calls drop the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
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

// Python's side of a C++ parameter: addresses as integers, blocks as (counts,
// displacements) lists, point-to-point ops as tuples, options as a timeout.
template <typename T>
struct Arg {
  using type = T;
  static T to(T v) { return v; }
};
template <>
struct Arg<const void*> {
  using type = uintptr_t;
  static const void* to(uintptr_t a) { return ptr(a); }
};
template <>
struct Arg<void*> {
  using type = uintptr_t;
  static void* to(uintptr_t a) { return ptr(a); }
};
template <>
struct Arg<const Blocks&> {
  using type = std::pair<std::vector<size_t>, std::vector<size_t>>;
  static Blocks to(const type& b) { return {b.first, b.second}; }
};
template <>
struct Arg<const CollectiveOptions&> {
  using type = std::optional<double>;
  static CollectiveOptions to(type timeout_s) { return collective(timeout_s); }
};
// (is_send, address, count, dtype, peer, tag)
template <>
struct Arg<const std::vector<P2POp>&> {
  using type = std::vector<std::tuple<bool, uintptr_t, size_t, DataType, int, uint32_t>>;
  static std::vector<P2POp> to(const type& ops) {
    std::vector<P2POp> out;
    for (const auto& [send, address, count, dtype, peer, tag] : ops) {
      out.push_back({send ? P2POp::send : P2POp::recv, ptr(address), count, dtype, peer, tag});
    }
    return out;
  }
};

// A Communicator method as a Python one taking Arg's types, arguments in the C++ order.
template <typename R, typename... A>
auto wrap(R (Communicator::*method)(A...)) {
  return [method](Communicator& c, typename Arg<A>::type... a) -> R { return (c.*method)(Arg<A>::to(a)...); };
}

// The gradient sync keeps its communicator alive.
struct PyGradientSync {
  std::shared_ptr<Communicator> comm;
  std::unique_ptr<fusion::GradientSync> sync;
};

}  // namespace

PYBIND11_MODULE(_tandem, m) {
  m.doc() = "tandem: collective communication for data-parallel training (C++ core)";
  m.attr("__version__") = TANDEM_VERSION_STRING;

  auto error = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<InvalidArgument>(m, "InvalidArgument", error.ptr());
  py::register_exception<Timeout>(m, "Timeout", error.ptr());
  py::register_exception<PeerFailure>(m, "PeerFailure", error.ptr());
  py::register_exception<Aborted>(m, "Aborted", error.ptr());

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
          "_allreduce",
          [](Communicator& c, uintptr_t in, uintptr_t out, size_t n, DataType t, ReduceOp op,
             std::optional<double> timeout) { c.allreduce(ptr(in), ptr(out), n, t, op, collective(timeout)); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "_allreduce_async",
          [](Communicator& c, uintptr_t in, uintptr_t out, size_t n, DataType t, ReduceOp op,
             std::optional<double> timeout) {
            return c.allreduce_async(ptr(in), ptr(out), n, t, op, collective(timeout));
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "_reduce_scatter",
          [](Communicator& c, uintptr_t in, uintptr_t out, size_t n, DataType t, ReduceOp op,
             std::optional<double> timeout) { c.reduce_scatter(ptr(in), ptr(out), n, t, op, collective(timeout)); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "_reduce_scatter_async",
          [](Communicator& c, uintptr_t in, uintptr_t out, size_t n, DataType t, ReduceOp op,
             std::optional<double> timeout) {
            return c.reduce_scatter_async(ptr(in), ptr(out), n, t, op, collective(timeout));
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "_allgather",
          [](Communicator& c, uintptr_t in, uintptr_t out, size_t n, DataType t, std::optional<double> timeout) {
            c.allgather(ptr(in), ptr(out), n, t, collective(timeout));
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "_allgather_async",
          [](Communicator& c, uintptr_t in, uintptr_t out, size_t n, DataType t, std::optional<double> timeout) {
            return c.allgather_async(ptr(in), ptr(out), n, t, collective(timeout));
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "_broadcast",
          [](Communicator& c, uintptr_t in, uintptr_t out, size_t n, DataType t, int root,
             std::optional<double> timeout) { c.broadcast(ptr(in), ptr(out), n, t, root, collective(timeout)); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "_broadcast_async",
          [](Communicator& c, uintptr_t in, uintptr_t out, size_t n, DataType t, int root,
             std::optional<double> timeout) {
            return c.broadcast_async(ptr(in), ptr(out), n, t, root, collective(timeout));
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "barrier", [](Communicator& c, std::optional<double> timeout) { c.barrier(collective(timeout)); },
          py::arg("timeout") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def(
          "barrier_async",
          [](Communicator& c, std::optional<double> timeout) { return c.barrier_async(collective(timeout)); },
          py::arg("timeout") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def("_alltoall", wrap(&Communicator::alltoall), nogil)
      .def("_alltoall_async", wrap(&Communicator::alltoall_async), nogil)
      .def("_alltoallv", wrap(&Communicator::alltoallv), nogil)
      .def("_alltoallv_async", wrap(&Communicator::alltoallv_async), nogil)
      .def("_reduce", wrap(&Communicator::reduce), nogil)
      .def("_reduce_async", wrap(&Communicator::reduce_async), nogil)
      .def("_gather", wrap(&Communicator::gather), nogil)
      .def("_gather_async", wrap(&Communicator::gather_async), nogil)
      .def("_gatherv", wrap(&Communicator::gatherv), nogil)
      .def("_gatherv_async", wrap(&Communicator::gatherv_async), nogil)
      .def("_scatter", wrap(&Communicator::scatter), nogil)
      .def("_scatter_async", wrap(&Communicator::scatter_async), nogil)
      .def("_scatterv", wrap(&Communicator::scatterv), nogil)
      .def("_scatterv_async", wrap(&Communicator::scatterv_async), nogil)
      .def("_allgatherv", wrap(&Communicator::allgatherv), nogil)
      .def("_allgatherv_async", wrap(&Communicator::allgatherv_async), nogil)
      .def("_reduce_scatterv", wrap(&Communicator::reduce_scatterv), nogil)
      .def("_reduce_scatterv_async", wrap(&Communicator::reduce_scatterv_async), nogil)
      .def("_send", wrap(&Communicator::send), nogil)
      .def("_send_async", wrap(&Communicator::send_async), nogil)
      .def("_recv", wrap(&Communicator::recv), nogil)
      .def("_recv_async", wrap(&Communicator::recv_async), nogil)
      .def("_group", wrap(&Communicator::group), nogil)
      .def("_group_async", wrap(&Communicator::group_async), nogil)
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
      .def("_allocate_shared", [](Communicator& c, size_t bytes) { return uintptr_t(c.allocate_shared(bytes)); })
      .def("_free_shared", [](Communicator& c, uintptr_t p) { c.free_shared(ptr(p)); })
      .def("abort", &Communicator::abort, py::arg("reason") = "abort() called",
           "Unblocks every pending and later call with Aborted (sticky); any thread")
      .def_property_readonly("aborted", &Communicator::aborted);

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
