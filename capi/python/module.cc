// tandem._tandem: the C++ API for Python. Buffers arrive as (address, count,
// dtype) so NumPy arrays and torch tensors alike are used in place (the
// package's Python layer takes the addresses); blocking calls drop the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

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
      .value("f32", DataType::f32).value("f64", DataType::f64).value("f16", DataType::f16)
      .value("bf16", DataType::bf16).value("i32", DataType::i32).value("i64", DataType::i64)
      .value("u8", DataType::u8);
  py::enum_<ReduceOp>(m, "ReduceOp")
      .value("sum", ReduceOp::sum).value("avg", ReduceOp::avg).value("min", ReduceOp::min)
      .value("max", ReduceOp::max).value("prod", ReduceOp::prod);

  py::class_<Request>(m, "Request")
      .def("test", &Request::test, py::call_guard<py::gil_scoped_release>(),
           "True once finished; raises the collective's error")
      .def(
          "wait",
          [](Request& r, std::optional<double> timeout_s) {
            if (timeout_s) r.wait(Clock::now() + std::chrono::milliseconds(int64_t(*timeout_s * 1e3)));
            else r.wait();
          },
          py::arg("timeout") = py::none(), py::call_guard<py::gil_scoped_release>(),
          "Waits (seconds; None: the collective's own deadline); Timeout leaves it running");

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
          py::arg("rank"), py::arg("size"), py::arg("store"), py::arg("host_store") = false,
          py::arg("timeout") = 300.0, py::arg("shared_memory") = true, py::arg("prefix") = "tandem",
          py::call_guard<py::gil_scoped_release>())
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
             std::optional<double> timeout) { return c.allreduce_async(ptr(in), ptr(out), n, t, op, collective(timeout)); },
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
             std::optional<double> timeout) { return c.broadcast_async(ptr(in), ptr(out), n, t, root, collective(timeout)); },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "barrier", [](Communicator& c, std::optional<double> timeout) { c.barrier(collective(timeout)); },
          py::arg("timeout") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def(
          "barrier_async", [](Communicator& c, std::optional<double> timeout) { return c.barrier_async(collective(timeout)); },
          py::arg("timeout") = py::none(), py::call_guard<py::gil_scoped_release>())
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
      .def("mark_ready", [](PyGradientSync& s, int id) { s.sync->mark_ready(id); },
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
