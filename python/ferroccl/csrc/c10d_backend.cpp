// The "ferroccl" torch backend's C++ face (docs/pytorch.md, "The C++
// backend"): a c10d::Backend that torch calls as it calls Gloo's.
//
// Calls on host tensors the library carries as they are (contiguous, a
// type it has, a plain reduction) go straight to the communicator through
// the table of C functions the Rust extension exports
// (python/src/native.rs): no Python, no GIL. Every other call (CUDA
// tensors, lists of tensors, types mapped or refused, tags, all-to-all,
// gather, scatter, PREMUL_SUM) is the Python backend's
// (ferroccl/torch.py), called with the GIL and wrapped in a Work that
// forwards every question torch asks of it, `is_completed` included:
// torch's own wrapper of a Python backend's Work does not forward it.
//
// Both routes issue on the same communicator, whose queue keeps one call
// order for the calls of both.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/python.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// The table of python/src/native.rs (`Api`), field for field.
struct Api {
  uint32_t version;
  const void* (*issue)(const void* comm, const char* kind, size_t send, size_t send_len,
                       size_t recv, size_t recv_len, const char* dtype, const char* op,
                       size_t root);
  void (*after)(const void* comm, void (*f)(void*), void* ctx);
  void (*wait)(const void* h);
  int32_t (*done)(const void* h);
  int32_t (*failed)(const void* h);
  int32_t (*raise_error)(const void* h);
  size_t (*message)(const void* h, char* buf, size_t cap);
  void (*release)(const void* h);
  void (*release_comm)(const void* comm);
};

constexpr uint32_t kApiVersion = 1;
constexpr const char* kCapsule = "ferroccl._ferroccl.native_api";

// Whether Python objects may be released here (not while the interpreter
// is going away: then they are left to it).
bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// Drop a Python reference with the GIL, or leave it where Python is
// finalizing.
void drop_object(py::object& o) {
  if (!o) {
    return;
  }
  if (python_alive()) {
    py::gil_scoped_acquire gil;
    o = py::object();
  } else {
    o.release();
  }
}

// A counted reference to a communicator's state, released once.
struct Comm {
  Api api;
  const void* ref;
  Comm(const Api& a, const void* r) : api(a), ref(r) {}
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm() { api.release_comm(ref); }
};

// One issued call's handle, released once.
struct Call {
  std::shared_ptr<Comm> comm;
  const void* h;
  Call(std::shared_ptr<Comm> c, const void* handle) : comm(std::move(c)), h(handle) {}
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  ~Call() { comm->api.release(h); }

  bool done() const { return comm->api.done(h) != 0; }
  bool failed() const { return comm->api.failed(h) != 0; }

  std::string message() const {
    std::string m(comm->api.message(h, nullptr, 0) + 1, '\0');
    size_t n = comm->api.message(h, m.data(), m.size());
    m.resize(n);
    return m;
  }

  // The call's error as the Python exception it is (a FerrocclError with
  // its rank, call and sequence number), caught as a C++ exception; its
  // message alone where Python is going away.
  std::exception_ptr error() const {
    if (python_alive()) {
      py::gil_scoped_acquire gil;
      if (comm->api.raise_error(h) != 0) {
        return std::make_exception_ptr(py::error_already_set());
      }
    }
    return std::make_exception_ptr(std::runtime_error(message()));
  }

  // Wait without the GIL (the worker may need it for a callback).
  void wait() const {
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      comm->api.wait(h);
    } else {
      comm->api.wait(h);
    }
  }
};

// The Work of a call issued straight to the library.
class NativeWork : public c10d::Work {
 public:
  NativeWork(std::shared_ptr<Call> call, c10d::OpType type, std::vector<at::Tensor> outputs,
             std::vector<at::Tensor> inputs, int rank)
      : c10d::Work(rank, type),
        call_(std::move(call)),
        outputs_(std::move(outputs)),
        inputs_(std::move(inputs)) {}

  bool isCompleted() override { return call_->done(); }

  bool isSuccess() const override { return call_->done() && !call_->failed(); }

  std::exception_ptr exception() const override {
    if (!call_->done() || !call_->failed()) {
      return nullptr;
    }
    return std::make_exception_ptr(std::runtime_error(call_->message()));
  }

  std::vector<at::Tensor> result() override { return outputs_; }

  bool wait(std::chrono::milliseconds /*timeout: the library's bounds every wait*/) override {
    call_->wait();
    if (call_->failed()) {
      std::rethrow_exception(call_->error());
    }
    return true;
  }

  // Completed on the communicator's worker once every call issued before
  // this request has ended (callbacks chained on the future issue calls,
  // which must come at the same place on every rank: PowerSGD's hooks).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    c10::intrusive_ptr<c10::ivalue::Future> future;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (future_) {
        return future_;
      }
      future_ = c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()));
      future = future_;
    }
    // Outside the lock: `complete` may run here, at once (on the worker,
    // or on a destroyed communicator), and its callbacks with it.
    auto* ctx = new Pending{future, call_, outputs_};
    call_->comm->api.after(call_->comm->ref, &NativeWork::complete, ctx);
    return future;
  }

 private:
  struct Pending {
    c10::intrusive_ptr<c10::ivalue::Future> future;
    std::shared_ptr<Call> call;
    std::vector<at::Tensor> outputs;
  };

  static void complete(void* p) {
    std::unique_ptr<Pending> ctx(static_cast<Pending*>(p));
    ctx->call->wait();
    if (ctx->call->failed()) {
      ctx->future->setError(ctx->call->error());
    } else {
      ctx->future->markCompleted(c10::IValue(ctx->outputs));
    }
  }

  std::shared_ptr<Call> call_;
  std::vector<at::Tensor> outputs_;
  // Held until the Work goes: the call reads them.
  std::vector<at::Tensor> inputs_;
  std::mutex mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The Work of a call the Python backend made: every question forwarded
// to the Python object.
class ForwardWork : public c10d::Work {
 public:
  explicit ForwardWork(py::object work)
      : work_(std::move(work)), inner_(work_.cast<c10::intrusive_ptr<c10d::Work>>()) {}

  ~ForwardWork() override { drop_object(work_); }

  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return work_.attr("is_completed")().cast<bool>();
  }

  bool isSuccess() const override {
    py::gil_scoped_acquire gil;
    return work_.attr("is_success")().cast<bool>();
  }

  std::vector<at::Tensor> result() override {
    py::gil_scoped_acquire gil;
    return work_.attr("result")().cast<std::vector<at::Tensor>>();
  }

  bool wait(std::chrono::milliseconds timeout) override { return inner_->wait(timeout); }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }

 private:
  py::object work_;
  // The same object as c10d sees it (its Python methods reached through
  // torch's trampoline).
  c10::intrusive_ptr<c10d::Work> inner_;
};

// The library's name of a torch type it carries as itself, else null.
const char* lib_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float";
    case at::kDouble:
      return "double";
    case at::kHalf:
      return "half";
    case at::kBFloat16:
      return "bfloat16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kUInt32:
      return "uint32";
    case at::kUInt64:
      return "uint64";
    default:
      return nullptr;
  }
}

// The library's name of a plain reduction, else null (PREMUL_SUM, the
// bitwise ones: the Python backend maps or refuses them).
const char* lib_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return "sum";
    case c10d::ReduceOp::AVG:
      return "avg";
    case c10d::ReduceOp::PRODUCT:
      return "prod";
    case c10d::ReduceOp::MIN:
      return "min";
    case c10d::ReduceOp::MAX:
      return "max";
    default:
      return nullptr;
  }
}

// A tensor the library takes as it is.
bool plain(const at::Tensor& t) {
  return t.layout() == at::kStrided && t.device().is_cpu() && t.is_contiguous() &&
         lib_type(t.scalar_type()) != nullptr;
}

class FerrocclBackend : public c10d::Backend {
 public:
  // `python` is the Python backend of the same group (ferroccl/torch.py),
  // `api` the extension's capsule, `ref` its communicator's
  // `_native_ref()`, whose release this takes over.
  FerrocclBackend(int rank, int size, py::object python, const py::capsule& api, uintptr_t ref)
      : c10d::Backend(rank, size), python_(std::move(python)) {
    auto* table = static_cast<const Api*>(PyCapsule_GetPointer(api.ptr(), kCapsule));
    if (table == nullptr) {
      throw py::error_already_set();
    }
    if (table->version != kApiVersion) {
      table->release_comm(reinterpret_cast<const void*>(ref));
      throw std::runtime_error(
          "ferroccl: the C++ torch backend was built for table version " +
          std::to_string(kApiVersion) + " and the extension has " +
          std::to_string(table->version) + ": rebuild it (docs/pytorch.md)");
    }
    comm_ = std::make_shared<Comm>(*table, reinterpret_cast<const void*>(ref));
  }

  ~FerrocclBackend() override { drop_object(python_); }

  const std::string getBackendName() const override { return "ferroccl"; }

  py::object python() const { return python_; }

  // -- straight to the library, where the tensors allow ----------------
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& ts,
                                           const c10d::AllreduceOptions& o) override {
    const char* op = lib_op(o.reduceOp);
    if (ts.size() == 1 && plain(ts[0]) && op != nullptr) {
      return issue("all_reduce", c10d::OpType::ALLREDUCE, &ts[0], &ts[0], op, 0, {ts[0]}, {});
    }
    return forward("allreduce", ts, o);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& ts,
                                           const c10d::BroadcastOptions& o) override {
    if (ts.size() == 1 && plain(ts[0])) {
      return issue("broadcast", c10d::OpType::BROADCAST, &ts[0], &ts[0], "sum",
                   static_cast<size_t>(o.rootRank), {ts[0]}, {});
    }
    return forward("broadcast", ts, o);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& ts,
                                        const c10d::ReduceOptions& o) override {
    const char* op = lib_op(o.reduceOp);
    if (ts.size() == 1 && plain(ts[0]) && op != nullptr) {
      return issue("reduce", c10d::OpType::REDUCE, &ts[0], &ts[0], op,
                   static_cast<size_t>(o.rootRank), {ts[0]}, {});
    }
    return forward("reduce", ts, o);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& o) override {
    if (plain(in) && plain(out) && in.scalar_type() == out.scalar_type()) {
      return issue("all_gather", c10d::OpType::_ALLGATHER_BASE, &in, &out, "sum", 0, {out}, {in});
    }
    return forward("_allgather_base", out, in, o);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& o) override {
    const char* op = lib_op(o.reduceOp);
    if (plain(in) && plain(out) && in.scalar_type() == out.scalar_type() && op != nullptr) {
      return issue("reduce_scatter", c10d::OpType::_REDUCE_SCATTER_BASE, &in, &out, op, 0, {out},
                   {in});
    }
    return forward("_reduce_scatter_base", out, in, o);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*o*/) override {
    return issue("barrier", c10d::OpType::BARRIER, nullptr, nullptr, "sum", 0, {}, {});
  }

  // -- the Python backend's ----------------------------------------------
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& ts, const c10d::AllreduceCoalescedOptions& o) override {
    return forward("allreduce_coalesced", ts, o);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outs,
                                           std::vector<at::Tensor>& ins,
                                           const c10d::AllgatherOptions& o) override {
    return forward("allgather", outs, ins, o);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
      const c10d::AllgatherOptions& o) override {
    return forward("allgather_into_tensor_coalesced", outs, ins, o);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outs,
                                                std::vector<std::vector<at::Tensor>>& ins,
                                                const c10d::ReduceScatterOptions& o) override {
    return forward("reduce_scatter", outs, ins, o);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
      const c10d::ReduceScatterOptions& o) override {
    return forward("reduce_scatter_tensor_coalesced", outs, ins, o);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outs,
                                        std::vector<at::Tensor>& ins,
                                        const c10d::GatherOptions& o) override {
    return forward("gather", outs, ins, o);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outs,
                                         std::vector<std::vector<at::Tensor>>& ins,
                                         const c10d::ScatterOptions& o) override {
    return forward("scatter", outs, ins, o);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in,
                                               std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& o) override {
    return forward("alltoall_base", out, in, out_splits, in_splits, o);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outs,
                                          std::vector<at::Tensor>& ins,
                                          const c10d::AllToAllOptions& o) override {
    return forward("alltoall", outs, ins, o);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& ts, int dst, int tag) override {
    return forward("send", ts, dst, tag);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& ts, int src, int tag) override {
    return forward("recv", ts, src, tag);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& ts, int tag) override {
    return forward("recv_anysource", ts, tag);
  }

  void abort() override { call_python("abort"); }

  void shutdown() override { call_python("shutdown"); }

 private:
  c10::intrusive_ptr<c10d::Work> issue(const char* kind, c10d::OpType type,
                                       const at::Tensor* send, const at::Tensor* recv,
                                       const char* op, size_t root,
                                       std::vector<at::Tensor> outputs,
                                       std::vector<at::Tensor> inputs) {
    const char* dtype = send != nullptr ? lib_type(send->scalar_type()) : "uint8";
    auto addr = [](const at::Tensor* t) {
      return t != nullptr ? reinterpret_cast<size_t>(t->data_ptr()) : size_t{0};
    };
    auto len = [](const at::Tensor* t) {
      return t != nullptr ? static_cast<size_t>(t->numel()) : size_t{0};
    };
    const void* h;
    auto run = [&] {
      h = comm_->api.issue(comm_->ref, kind, addr(send), len(send), addr(recv), len(recv), dtype,
                           op, root);
    };
    // A call may run at once on this thread: never with the GIL held
    // (torch's bindings release it before they reach a backend).
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      run();
    } else {
      run();
    }
    auto call = std::make_shared<Call>(comm_, h);
    if (!call->done()) {
      // Queued behind other calls: its tensors stay alive until it has
      // ended even if the caller drops the Work (Gloo's queue holds its
      // work the same way), released on the worker right after it.
      auto* keep = new Kept{call, outputs, inputs};
      comm_->api.after(comm_->ref, &FerrocclBackend::release_kept, keep);
    }
    return c10::make_intrusive<NativeWork>(std::move(call), type, std::move(outputs),
                                           std::move(inputs), getRank());
  }

  struct Kept {
    std::shared_ptr<Call> call;
    std::vector<at::Tensor> outputs;
    std::vector<at::Tensor> inputs;
  };

  static void release_kept(void* p) { delete static_cast<Kept*>(p); }

  // Every argument goes to Python as a copy (a list of the same tensors;
  // options Python code may keep).
  template <typename... Args>
  c10::intrusive_ptr<c10d::Work> forward(const char* name, const Args&... args) {
    py::gil_scoped_acquire gil;
    py::object w = python_.attr(name)(py::cast(args, py::return_value_policy::copy)...);
    return c10::make_intrusive<ForwardWork>(std::move(w));
  }

  void call_python(const char* name) {
    if (!python_alive()) {
      return;
    }
    py::gil_scoped_acquire gil;
    python_.attr(name)();
  }

  py::object python_;
  std::shared_ptr<Comm> comm_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("API_VERSION") = kApiVersion;
  py::class_<FerrocclBackend, c10d::Backend, c10::intrusive_ptr<FerrocclBackend>>(
      m, "FerrocclBackend",
      "The ferroccl torch backend (C++): host calls straight to the library, the rest "
      "through its Python backend.")
      .def(py::init<int, int, py::object, const py::capsule&, uintptr_t>(), py::arg("rank"),
           py::arg("size"), py::arg("python"), py::arg("api"), py::arg("ref"))
      .def_property_readonly(
          "python_backend", &FerrocclBackend::python,
          "The group's Python backend (ferroccl.torch.ProcessGroupFerroccl).")
      .def_property_readonly(
          "comm", [](const FerrocclBackend& b) { return b.python().attr("comm"); },
          "The group's ferroccl communicator.");
}
