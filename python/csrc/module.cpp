// spark_decode._C: the library's classes for Python, torch-free.
//
// Tensors cross this boundary as plain descriptions, (data pointer, dtype
// name, shape, strides in elements, device ordinal or -1), and streams as
// the integer value of a cudaStream_t: the Python package (spark_decode/)
// turns torch tensors and torch's current stream into those and wraps the
// scratch views the Pooler returns back into tensors. So this module needs
// no torch headers and no pybind11 ABI shared with torch, and the library
// below it keeps its one dependency, the CUDA toolkit.
//
// Lifetimes: the C++ objects hold views (weights, norm weights, scales,
// tickets) and a Group reference; the Python classes keep those objects
// alive for as long as the C++ object lives (and keep_alive below does the
// same for the mailbox and group arguments).
//
// Errors: spark_decode::InvalidArgument is raised as InvalidArgument, a
// subclass of ValueError; spark_decode::RuntimeError (and any other library
// error) as SparkRuntimeError, a subclass of RuntimeError. Values this file
// converts itself (descriptions, tactic fields, layers) go through as<T>, so
// that one that does not fit (an int above 32 bits, a string for an int) is
// an InvalidArgument naming the field, not pybind11's cast_error (a
// RuntimeError without a reason).
#include <cuda_runtime_api.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <type_traits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "spark_decode/error.h"
#include "spark_decode/expert_norm.h"
#include "spark_decode/group.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/nvfp4.h"
#include "spark_decode/pooler.h"
#include "spark_decode/pooler_gemm.h"
#include "spark_decode/unpooler.h"

namespace py = pybind11;
namespace sd = spark_decode;

namespace {

// ---- conversions ------------------------------------------------------------------

template <typename T>
const char* kind_of() {
  if constexpr (std::is_same_v<T, int>) return "a 32-bit integer";
  else if constexpr (std::is_same_v<T, int64_t>) return "a 64-bit integer";
  else if constexpr (std::is_same_v<T, uintptr_t>) return "an address (a non-negative 64-bit integer)";
  else if constexpr (std::is_same_v<T, float>) return "a float";
  else if constexpr (std::is_same_v<T, bool>) return "a bool";
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "a sequence of 64-bit integers";
  else if constexpr (std::is_same_v<T, std::vector<int>>) return "a sequence of 32-bit integers";
  else if constexpr (std::is_same_v<T, py::tuple>) return "a tuple";
  else if constexpr (std::is_same_v<T, py::dict>) return "a dict";
  else return "of the expected type";
}

// h as T, or InvalidArgument naming `what` and the value.
template <typename T>
T as(const py::handle& h, const std::string& what) {
  try {
    return h.cast<T>();
  } catch (const py::cast_error&) {
    std::string value;
    try {
      value = py::repr(h).cast<std::string>();
    } catch (const py::error_already_set&) {
      value = "?";
    }
    if (value.size() > 80) value = value.substr(0, 77) + "...";
    throw sd::InvalidArgument(what + " = " + value + " is not " + kind_of<T>());
  }
}

sd::OutputFormat format_from(const std::string& name) {
  for (sd::OutputFormat f : {sd::OutputFormat::bf16, sd::OutputFormat::nvfp4, sd::OutputFormat::nvfp4_swizzled})
    if (name == sd::format_name(f)) return f;
  throw sd::InvalidArgument("output format '" + name + "' is not one of bf16, nvfp4, nvfp4_swizzled");
}

// ---- tensor descriptions -----------------------------------------------------

sd::DType dtype_from(const std::string& name) {
  for (sd::DType d : {sd::DType::bf16, sd::DType::f32, sd::DType::i32, sd::DType::u8, sd::DType::e4m3})
    if (name == sd::dtype_name(d)) return d;
  throw sd::InvalidArgument("dtype '" + name + "' is not one the library takes (bf16, f32, i32, u8, e4m3)");
}

// (data, dtype, shape, strides, device) -> TensorRef.
sd::TensorRef tensor_ref(const py::tuple& t) {
  if (t.size() != 5) throw sd::InvalidArgument("a tensor description is (data, dtype, shape, strides, device)");
  sd::TensorRef r;
  r.data = reinterpret_cast<void*>(as<uintptr_t>(t[0], "a tensor's data pointer"));
  r.dtype = dtype_from(as<std::string>(t[1], "a tensor's dtype"));
  const auto shape = as<std::vector<int64_t>>(t[2], "a tensor's shape");
  const auto stride = as<std::vector<int64_t>>(t[3], "a tensor's strides");
  if (shape.size() != stride.size() || shape.size() > sd::TensorRef::kMaxDims)
    throw sd::InvalidArgument("tensors of at most " + std::to_string(sd::TensorRef::kMaxDims) + " dimensions");
  r.ndim = static_cast<int>(shape.size());
  for (int i = 0; i < r.ndim; ++i) {
    r.shape[i] = shape[i];
    r.stride[i] = stride[i];
  }
  r.device = as<int>(t[4], "a tensor's device");
  return r;
}

std::optional<sd::TensorRef> optional_ref(const std::optional<py::tuple>& t) {
  if (!t) return std::nullopt;
  return tensor_ref(*t);
}

// A description or None (a Python object), as an optional TensorRef.
std::optional<sd::TensorRef> optional_ref(const py::handle& h, const std::string& what) {
  if (h.is_none()) return std::nullopt;
  return tensor_ref(as<py::tuple>(h, what));
}

// TensorRef -> (data, dtype, shape, strides, device).
py::tuple describe(const sd::TensorRef& r) {
  std::vector<int64_t> shape(r.shape.begin(), r.shape.begin() + r.ndim);
  std::vector<int64_t> stride(r.stride.begin(), r.stride.begin() + r.ndim);
  return py::make_tuple(reinterpret_cast<uintptr_t>(r.data), std::string(sd::dtype_name(r.dtype)),
                        py::tuple(py::cast(shape)), py::tuple(py::cast(stride)), r.device);
}

cudaStream_t stream_of(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// f() with the GIL released: the library's calls touch no Python object
// (a group's callbacks take the GIL back), and other threads (ranks of this
// process) may need it meanwhile.
template <typename F>
auto without_gil(F&& f) {
  py::gil_scoped_release release;
  return f();
}

// ---- tactics --------------------------------------------------------------------

py::dict tactic_dict(const sd::SplitKTactic& t) {
  py::dict d;
  d["splits"] = t.splits;
  d["kw"] = t.kw;
  d["accs"] = t.accs;
  d["token_tile"] = std::vector<int>(t.token_tile.begin(), t.token_tile.end());
  d["row_tiles"] = std::vector<int>(t.row_tiles.begin(), t.row_tiles.end());
  d["cluster_balance"] = t.cluster_balance;
  d["row_swizzle"] = t.row_swizzle;
  return d;
}

// Keys missing from `d` keep the table's value for [n, k], except
// row_swizzle where `d` changes kw or accs: the fragment-order loads the
// table may pick are compiled for one (kw, accs) only, the swizzled ones
// for all, so another kw or accs gets them unless asked otherwise.
sd::SplitKTactic tactic_from(const py::dict& d, int n, int k) {
  sd::SplitKTactic t = sd::unpooler_tactic(n, k);
  const sd::SplitKTactic table = t;
  bool swizzle_given = false;
  for (auto item : d) {
    const auto key = as<std::string>(item.first, "a tactic field's name");
    const std::string field = "tactic field '" + key + "'";
    if (key == "splits") {
      t.splits = as<int>(item.second, field);
    } else if (key == "kw") {
      t.kw = as<int>(item.second, field);
    } else if (key == "accs") {
      t.accs = as<int>(item.second, field);
    } else if (key == "cluster_balance") {
      t.cluster_balance = as<bool>(item.second, field);
    } else if (key == "row_swizzle") {
      t.row_swizzle = as<bool>(item.second, field);
      swizzle_given = true;
    } else if (key == "token_tile" || key == "row_tiles") {
      // A list of one entry per m in 1..16, or {m: value} over the table's.
      auto& dst = key == "token_tile" ? t.token_tile : t.row_tiles;
      if (py::isinstance<py::dict>(item.second)) {
        for (auto [m, v] : item.second.cast<py::dict>()) {
          const int mi = as<int>(m, field + " key");
          if (mi < 1 || mi > static_cast<int>(dst.size()))
            throw sd::InvalidArgument(key + ": m " + std::to_string(mi) + " outside 1.." +
                                      std::to_string(dst.size()));
          dst[mi - 1] = as<int>(v, field + " at m " + std::to_string(mi));
        }
      } else {
        const auto v = as<std::vector<int>>(item.second, field);
        if (v.size() != dst.size())
          throw sd::InvalidArgument(key + " needs one entry per m in 1.." + std::to_string(dst.size()));
        std::copy(v.begin(), v.end(), dst.begin());
      }
    } else {
      throw sd::InvalidArgument("unknown tactic field '" + key + "'");
    }
  }
  if (!swizzle_given && (t.kw != table.kw || t.accs != table.accs)) t.row_swizzle = true;
  return t;
}

// [n, k] of a 2-D weight, n divided by tp (a shard of a replicated
// weight), or zeros: the shape whose table tactic a tactic dict overrides.
std::pair<int, int> weight_nk(const sd::TensorRef& w, int tp = 1) {
  if (w.ndim != 2 || tp < 1) return {0, 0};
  return {static_cast<int>(w.shape[0]) / tp, static_cast<int>(w.shape[1])};
}

sd::Unpooler::Options unpooler_options(sd::LamportMailbox* mailbox, bool enable_pdl,
                                       const std::optional<py::tuple>& ticket,
                                       std::optional<std::vector<int>> rows,
                                       const std::optional<py::dict>& tactic, int n, int k) {
  sd::Unpooler::Options o;
  o.enable_pdl = enable_pdl;
  o.mailbox = mailbox;
  o.ticket = optional_ref(ticket);
  o.rows = std::move(rows);
  if (tactic) o.tactic = tactic_from(*tactic, n, k);
  return o;
}

// ---- a Group whose all-gather and barrier are Python callables -------------------

// The rendezvous over torch.distributed (spark_decode/group.py) or anything
// else Python can reach. Called only at construction, warm-up and barriers,
// from the thread that holds (or re-takes) the GIL.
class CallbackGroup final : public sd::Group {
 public:
  CallbackGroup(int rank, int size, std::function<py::bytes(py::bytes)> all_gather,
                std::function<void()> barrier)
      : rank_(rank), size_(size), all_gather_(std::move(all_gather)), barrier_(std::move(barrier)) {
    SPARK_CHECK(size >= 1 && rank >= 0 && rank < size, "group rank ", rank, " of size ", size);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<uint8_t> all_gather(const void* data, size_t bytes) override {
    py::gil_scoped_acquire gil;
    const std::string got =
        all_gather_(py::bytes(static_cast<const char*>(data), bytes)).cast<std::string>();
    SPARK_CHECK_RUNTIME(got.size() == bytes * static_cast<size_t>(size_), "the group's all_gather returned ",
                        got.size(), " bytes, expected ", size_, " x ", bytes);
    return std::vector<uint8_t>(got.begin(), got.end());
  }
  void barrier() override {
    py::gil_scoped_acquire gil;
    barrier_();
  }

 private:
  int rank_, size_;
  std::function<py::bytes(py::bytes)> all_gather_;
  std::function<void()> barrier_;
};

// The caller's outputs of a consumer: (format, a, a_sf, normed), the unused
// ones None.
sd::PoolerOutput pooler_output_from(const py::tuple& t) {
  if (t.size() != 4) throw sd::InvalidArgument("pooler outputs are (format, a, a_sf, normed)");
  sd::PoolerOutput o;
  o.format = format_from(as<std::string>(t[0], "the outputs' format"));
  if (auto a = optional_ref(t[1], "output a")) o.a = *a;
  if (auto a_sf = optional_ref(t[2], "output a_sf")) o.a_sf = *a_sf;
  if (auto normed = optional_ref(t[3], "output normed")) o.normed = *normed;
  return o;
}

py::dict output_spec(const sd::PoolerOutputSpec& s) {
  py::dict d;
  for (auto [name, t] : {std::pair{"a", &s.a}, std::pair{"a_sf", &s.a_sf}, std::pair{"normed", &s.normed}})
    if (t->ndim > 0)
      d[name] = py::make_tuple(std::string(sd::dtype_name(t->dtype)), py::make_tuple(t->shape[0], t->shape[1]));
  return d;
}

py::dict pooler_output(const sd::PoolerOutput& o) {
  py::dict d;
  d["format"] = sd::format_name(o.format);
  d["nvfp4"] = o.format != sd::OutputFormat::bf16;
  if (o.format != sd::OutputFormat::bf16) {
    d["a"] = describe(o.a);
    d["a_sf"] = describe(o.a_sf);
  } else {
    d["normed"] = describe(o.normed);
  }
  return d;
}

sd::PoolerLayer pooler_layer_from(const py::tuple& t) {
  if (t.size() != 6)
    throw sd::InvalidArgument("a pooler layer is (weight, norm_weight, eps, gain_center, global_scale, format)");
  sd::PoolerLayer l;
  l.weight = tensor_ref(as<py::tuple>(t[0], "a layer's weight"));
  l.norm_weight = tensor_ref(as<py::tuple>(t[1], "a layer's norm weight"));
  l.eps = as<float>(t[2], "a layer's eps");
  l.gain_center = as<float>(t[3], "a layer's gain_center");
  l.global_scale = optional_ref(t[4], "a layer's global scale");
  if (!t[5].is_none()) l.format = format_from(as<std::string>(t[5], "a layer's format"));
  return l;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "spark-decode's C++ classes over tensor descriptions (use the spark_decode package)";
  // The exception types live as long as the process: raw references, never
  // released (a static py::object would be destroyed after the interpreter).
  static PyObject* invalid_type = nullptr;
  static PyObject* runtime_type = nullptr;
  invalid_type = py::exception<sd::InvalidArgument>(m, "InvalidArgument", PyExc_ValueError).inc_ref().ptr();
  runtime_type = py::exception<sd::Error>(m, "SparkRuntimeError", PyExc_RuntimeError).inc_ref().ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const sd::InvalidArgument& e) {
      PyErr_SetString(invalid_type, e.what());
    } catch (const sd::Error& e) {
      PyErr_SetString(runtime_type, e.what());
    }
  });

  // ---- Unpooler ----
  m.def("launch_unsupported", py::overload_cast<int, int, int, int, int>(&sd::launch_unsupported),
        py::arg("n"), py::arg("k"), py::arg("splits"), py::arg("kw"), py::arg("accs"));
  m.def("tactic_unsupported", [](int n, int k, const py::dict& t) {
    return sd::launch_unsupported(n, k, tactic_from(t, n, k));
  });
  m.def("unpooler_tactic", [](int n, int k) { return tactic_dict(sd::unpooler_tactic(n, k)); });
  m.def("format_plan_table", &sd::format_plan_table);
  m.attr("MAX_BATCH") = sd::kMaxBatch;
  m.attr("HIDDEN") = sd::kMuseSpark.hidden;
  m.attr("POOLED") = sd::kMuseSpark.pooled;
  m.attr("LAYERS") = sd::kMuseSpark.layers;
  m.attr("__version__") = SPARK_DECODE_VERSION;
  // The CUDA runtime this module was compiled against (CUDART_VERSION, e.g.
  // 13000) and the one the process loaded (cudaRuntimeGetVersion: no GPU
  // needed), which spark_decode/__init__.py compares with torch's.
  m.attr("CUDA_RUNTIME_BUILT") = CUDART_VERSION;
  m.def("cuda_runtime_version", [] {
    int v = 0;
    CUDA_CHECK(cudaRuntimeGetVersion(&v));
    return v;
  });

  py::class_<sd::Unpooler>(m, "Unpooler")
      .def(py::init([](const py::tuple& weight, sd::LamportMailbox* mailbox, bool enable_pdl,
                       const std::optional<py::tuple>& ticket, std::optional<std::vector<int>> rows,
                       const std::optional<py::dict>& tactic) {
             const sd::TensorRef w = tensor_ref(weight);
             const auto [n, k] = weight_nk(w);
             return sd::Unpooler(w, unpooler_options(mailbox, enable_pdl, ticket, std::move(rows), tactic, n, k));
           }),
           py::arg("weight"), py::arg("mailbox").none(true), py::arg("enable_pdl"), py::arg("ticket").none(true),
           py::arg("rows").none(true), py::arg("tactic").none(true), py::keep_alive<1, 3>())
      .def_static(
          "from_moe",
          [](const py::tuple& full_weight, int tp, int rank, sd::LamportMailbox* mailbox, bool enable_pdl,
             const std::optional<py::tuple>& ticket, std::optional<std::vector<int>> rows,
             const std::optional<py::dict>& tactic) {
            const sd::TensorRef w = tensor_ref(full_weight);
            const auto [n, k] = weight_nk(w, tp);  // the shard's table tactic, as the constructor picks it
            return sd::Unpooler::from_moe(
                w, tp, rank, unpooler_options(mailbox, enable_pdl, ticket, std::move(rows), tactic, n, k));
          },
          py::arg("full_weight"), py::arg("tp"), py::arg("rank"), py::arg("mailbox").none(true),
          py::arg("enable_pdl"), py::arg("ticket").none(true), py::arg("rows").none(true),
          py::arg("tactic").none(true), py::keep_alive<0, 4>())
      .def_static(
          "unsupported",
          [](const py::tuple& weight, const std::optional<py::dict>& tactic) -> std::optional<std::string> {
            // A reason or None, never an exception (its documented contract).
            try {
              const sd::TensorRef w = tensor_ref(weight);
              if (!tactic) return sd::Unpooler::unsupported(w);
              const auto [n, k] = weight_nk(w);
              return sd::Unpooler::unsupported(w, tactic_from(*tactic, n, k));
            } catch (const sd::InvalidArgument& e) {
              return std::string(e.what());
            } catch (const py::cast_error& e) {  // a value none of as<T> converts
              return std::string("unsupported: ") + e.what();
            }
          },
          py::arg("weight"), py::arg("tactic").none(true))
      .def(
          "run",
          [](sd::Unpooler& u, const py::tuple& x, const py::tuple& out, uintptr_t stream) {
            const sd::TensorRef xr = tensor_ref(x), outr = tensor_ref(out);
            without_gil([&] { u.run(xr, outr, stream_of(stream)); });
          },
          py::arg("x"), py::arg("out"), py::arg("stream"))
      .def_property_readonly("n", &sd::Unpooler::n)
      .def_property_readonly("k", &sd::Unpooler::k)
      .def_property_readonly("max_m", &sd::Unpooler::max_m)
      .def_property_readonly("device", &sd::Unpooler::device)
      .def_property_readonly("enable_pdl", &sd::Unpooler::enable_pdl)
      .def_property_readonly("tactic", [](const sd::Unpooler& u) { return tactic_dict(u.tactic()); })
      .def("prepared", &sd::Unpooler::prepared, py::arg("tile"), py::arg("row_tiles") = 1);

  // ---- Group, LamportMailbox ----
  // "poison" (the default) or "trap": LamportMailbox::OnFailure.
  const auto on_failure_of = [](const std::string& s) {
    if (s == "poison") return sd::LamportMailbox::OnFailure::poison;
    if (s == "trap") return sd::LamportMailbox::OnFailure::trap;
    throw sd::InvalidArgument("on_failure '" + s + "' is neither 'poison' nor 'trap'");
  };
  py::class_<sd::Group>(m, "Group")
      .def_property_readonly("rank", &sd::Group::rank)
      .def_property_readonly("size", &sd::Group::size)
      // The rendezvous as the library calls it (every rank's bytes, in rank
      // order), checked the same way: for tests of a transport.
      .def("all_gather",
           [](sd::Group& g, const py::bytes& data) {
             const std::string in = data;
             const std::vector<uint8_t> out = g.all_gather(in.data(), in.size());
             return py::bytes(reinterpret_cast<const char*>(out.data()), out.size());
           })
      .def("barrier", &sd::Group::barrier);
  py::class_<CallbackGroup, sd::Group>(m, "CallbackGroup")
      .def(py::init<int, int, std::function<py::bytes(py::bytes)>, std::function<void()>>(), py::arg("rank"),
           py::arg("size"), py::arg("all_gather"), py::arg("barrier"));

  py::class_<sd::LamportMailbox>(m, "LamportMailbox")
      .def(py::init([on_failure_of](sd::Group& group, int tp, int rank, int capacity, int width, int device,
                                    double spin_timeout_s, size_t guard_bytes, const std::string& on_failure) {
             sd::LamportMailbox::Options o;
             o.spin_timeout_s = spin_timeout_s;
             o.on_failure = on_failure_of(on_failure);
             o.guard_bytes = guard_bytes;
             // Collective: other ranks may be threads of this process that
             // need the GIL to reach their constructor (the group's
             // callbacks take it back).
             return without_gil(
                 [&] { return std::make_unique<sd::LamportMailbox>(group, tp, rank, capacity, width, device, o); });
           }),
           py::arg("group"), py::arg("tp"), py::arg("rank"), py::arg("capacity"), py::arg("width"),
           py::arg("device"), py::arg("spin_timeout_s"), py::arg("guard_bytes") = 0, py::arg("on_failure") = "poison",
           py::keep_alive<1, 2>())
      .def(
          "publish",
          [](sd::LamportMailbox& mb, const py::tuple& src, uintptr_t stream, bool enable_pdl) {
            const sd::TensorRef s = tensor_ref(src);
            sd::LamportMailbox::PublishOptions o;
            o.enable_pdl = enable_pdl;
            without_gil([&] { mb.publish(s, stream_of(stream), o); });
          },
          py::arg("src"), py::arg("stream"), py::arg("enable_pdl") = true)
      .def(
          "gather",
          [](sd::LamportMailbox& mb, const py::tuple& out, uintptr_t stream, bool enable_pdl) {
            const sd::TensorRef o = tensor_ref(out);
            sd::LamportMailbox::GatherOptions opt;
            opt.enable_pdl = enable_pdl;
            without_gil([&] { mb.gather(o, stream_of(stream), opt); });
          },
          py::arg("out"), py::arg("stream"), py::arg("enable_pdl") = true)
      .def("synchronize", [](const sd::LamportMailbox& mb, uintptr_t stream) { mb.synchronize(stream_of(stream)); },
           py::call_guard<py::gil_scoped_release>())
      .def("timeout_report", &sd::LamportMailbox::timeout_report)
      .def("check", &sd::LamportMailbox::check)
      .def("warm_up", [](sd::LamportMailbox& mb, uintptr_t stream) { mb.warm_up(stream_of(stream)); },
           py::call_guard<py::gil_scoped_release>())
      .def("barrier", &sd::LamportMailbox::barrier, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("tp", &sd::LamportMailbox::tp)
      .def_property_readonly("rank", &sd::LamportMailbox::rank)
      .def_property_readonly("capacity", &sd::LamportMailbox::capacity)
      .def_property_readonly("width", &sd::LamportMailbox::width)
      .def_property_readonly("device", &sd::LamportMailbox::device)
      .def_property_readonly("shares_device", &sd::LamportMailbox::shares_device)
      .def_property_readonly("stage_state", [](const sd::LamportMailbox& mb) {
        return describe(sd::TensorRef::contiguous(mb.view().state, sd::DType::i32, {2}, mb.device()));
      });

  // ---- ExpertNorm ----
  py::class_<sd::ExpertNorm>(m, "ExpertNorm")
      .def(py::init([](const py::tuple& weight, float eps, float gain_center, bool enable_pdl) {
             return sd::ExpertNorm(tensor_ref(weight), eps, gain_center, enable_pdl);
           }),
           py::arg("weight"), py::arg("eps"), py::arg("gain_center"), py::arg("enable_pdl"))
      .def_static("cols_unsupported", &sd::ExpertNorm::cols_unsupported)
      .def(
          "run",
          [](const sd::ExpertNorm& e, const py::tuple& x, const py::tuple& y, uintptr_t stream) {
            const sd::TensorRef xr = tensor_ref(x), yr = tensor_ref(y);
            without_gil([&] { e.run(xr, yr, stream_of(stream)); });
          },
          py::arg("x"), py::arg("y"), py::arg("stream"))
      .def_property_readonly("cols", &sd::ExpertNorm::cols);

  // ---- the stock path's pieces: the quantize kernel, the pooler GEMM alone ----
  m.def(
      "nvfp4_quantize",
      [](const py::tuple& y, const py::tuple& global_scale, const py::tuple& a, const py::tuple& a_sf,
         uintptr_t stream, bool enable_pdl, bool swizzled) {
        const sd::TensorRef yr = tensor_ref(y), gr = tensor_ref(global_scale), ar = tensor_ref(a),
                            sr = tensor_ref(a_sf);
        without_gil([&] {
          sd::nvfp4_quantize(yr, gr, ar, sr, stream_of(stream), enable_pdl,
                             swizzled ? sd::ScaleLayout::swizzled : sd::ScaleLayout::linear);
        });
      },
      py::arg("y"), py::arg("global_scale"), py::arg("a"), py::arg("a_sf"), py::arg("stream"),
      py::arg("enable_pdl"), py::arg("swizzled"));
  m.def(
      "pooler_output_spec",
      [](const std::string& format, int b, int pooled) {
        return output_spec(sd::pooler_output_spec(format_from(format), b, pooled));
      },
      py::arg("format"), py::arg("b"), py::arg("pooled"));

  py::class_<sd::PoolerGemm>(m, "PoolerGemm")
      .def(py::init([](const py::tuple& weight, int tp, std::vector<int> batches, bool enable_pdl) {
             sd::PoolerGemm::Options o;
             o.enable_pdl = enable_pdl;
             o.batches = std::move(batches);
             return sd::PoolerGemm(tensor_ref(weight), tp, o);
           }),
           py::arg("weight"), py::arg("tp"), py::arg("batches"), py::arg("enable_pdl"))
      .def(
          "run",
          [](const sd::PoolerGemm& g, const py::tuple& x, const py::tuple& out, uintptr_t stream) {
            const sd::TensorRef xr = tensor_ref(x), outr = tensor_ref(out);
            without_gil([&] { g.run(xr, outr, stream_of(stream)); });
          },
          py::arg("x"), py::arg("out"), py::arg("stream"))
      .def("choice", [](const sd::PoolerGemm& g, int m) { return g.choice(m).to_string(); })
      .def_property_readonly("n", &sd::PoolerGemm::n)
      .def_property_readonly("k", &sd::PoolerGemm::k)
      .def_property_readonly("device", &sd::PoolerGemm::device);

  // ---- Pooler ----
  m.def(
      "pooler_layer",
      [](const py::tuple& pooler_weight, bool norm_present, bool has_weight,
         std::optional<int> variance_size_override, bool applies_weight_before_norm,
         const std::optional<py::tuple>& norm_weight, float variance_epsilon, float fused_gain_center,
         const std::optional<py::tuple>& global_scale, int tp, int rank) {
        sd::StockMoeLayer moe;
        moe.pooler_weight = tensor_ref(pooler_weight);
        moe.pre_expert_norm.present = norm_present;
        moe.pre_expert_norm.has_weight = has_weight;
        moe.pre_expert_norm.variance_size_override = variance_size_override;
        moe.pre_expert_norm.applies_weight_before_norm = applies_weight_before_norm;
        if (norm_weight) moe.pre_expert_norm.weight = tensor_ref(*norm_weight);
        moe.pre_expert_norm.variance_epsilon = variance_epsilon;
        moe.pre_expert_norm.fused_gain_center = fused_gain_center;
        moe.nvfp4_input_global_scale = optional_ref(global_scale);
        const sd::PoolerLayer l = sd::pooler_layer(moe, tp, rank);
        return py::make_tuple(describe(l.weight), describe(l.norm_weight), l.eps, l.gain_center,
                              l.global_scale ? py::object(describe(*l.global_scale)) : py::object(py::none()));
      },
      py::arg("pooler_weight"), py::arg("norm_present"), py::arg("has_weight"),
      py::arg("variance_size_override").none(true), py::arg("applies_weight_before_norm"),
      py::arg("norm_weight").none(true), py::arg("variance_epsilon"), py::arg("fused_gain_center"),
      py::arg("global_scale").none(true), py::arg("tp"), py::arg("rank"));

  py::class_<sd::Pooler>(m, "Pooler")
      .def(py::init([on_failure_of](sd::Group& group, int tp, int rank, int device,
                                    const std::vector<py::tuple>& layers, std::vector<int> batches, int capacity,
                                    bool enable_pdl, double spin_timeout_s, const std::string& on_failure) {
             std::vector<sd::PoolerLayer> ls;
             for (const auto& l : layers) ls.push_back(pooler_layer_from(l));
             sd::PoolerOptions o;
             o.spin_timeout_s = spin_timeout_s;
             o.on_failure = on_failure_of(on_failure);
             return without_gil([&] {  // collective, as the mailbox's
               return std::make_unique<sd::Pooler>(group, tp, rank, device, std::move(ls), std::move(batches),
                                                   capacity, enable_pdl, o);
             });
           }),
           py::arg("group"), py::arg("tp"), py::arg("rank"), py::arg("device"), py::arg("layers"),
           py::arg("batches"), py::arg("capacity"), py::arg("enable_pdl"), py::arg("spin_timeout_s"),
           py::arg("on_failure") = "poison", py::keep_alive<1, 2>())
      // The workspace alone (collective): the mailbox and scratch for layers
      // of [P / tp, H] attached later.
      .def_static(
          "workspace",
          [on_failure_of](sd::Group& group, int tp, int rank, int device, int hidden, int pooled,
                          std::vector<int> batches, int capacity, bool enable_pdl, double spin_timeout_s,
                          const std::string& on_failure) {
            sd::PoolerConfig c;
            c.tp = tp;
            c.rank = rank;
            c.device = device;
            c.hidden = hidden;
            c.pooled = pooled;
            c.batches = std::move(batches);
            c.capacity = capacity;
            c.enable_pdl = enable_pdl;
            c.options.spin_timeout_s = spin_timeout_s;
            c.options.on_failure = on_failure_of(on_failure);
            return without_gil([&] { return std::make_unique<sd::Pooler>(group, c); });
          },
          py::arg("group"), py::arg("tp"), py::arg("rank"), py::arg("device"), py::arg("hidden"), py::arg("pooled"),
          py::arg("batches"), py::arg("capacity"), py::arg("enable_pdl"), py::arg("spin_timeout_s"),
          py::arg("on_failure") = "poison",
          py::keep_alive<0, 1>())
      .def(
          "attach",
          [](sd::Pooler& p, int index, const py::tuple& layer) {
            const sd::PoolerLayer l = pooler_layer_from(layer);
            without_gil([&] { p.attach(index, l); });
          },
          py::arg("index"), py::arg("layer"))
      .def("attached", &sd::Pooler::attached, py::arg("index"))
      .def(
          "format", [](const sd::Pooler& p, int layer) { return std::string(sd::format_name(p.format(layer))); },
          py::arg("layer"))
      .def(
          "run_into",
          [](sd::Pooler& p, int layer, const py::tuple& x, const py::tuple& out, uintptr_t stream) {
            const sd::TensorRef xr = tensor_ref(x);
            const sd::PoolerOutput o = pooler_output_from(out);
            without_gil([&] { p.run(layer, xr, o, stream_of(stream)); });
          },
          py::arg("layer"), py::arg("x"), py::arg("out"), py::arg("stream"))
      .def(
          "gather_into",
          [](sd::Pooler& p, int layer, int b, const py::tuple& out, uintptr_t stream) {
            const sd::PoolerOutput o = pooler_output_from(out);
            without_gil([&] { p.gather(layer, b, o, stream_of(stream)); });
          },
          py::arg("layer"), py::arg("b"), py::arg("out"), py::arg("stream"))
      .def(
          "project",
          [](sd::Pooler& p, int layer, const py::tuple& x, uintptr_t stream) {
            const sd::TensorRef xr = tensor_ref(x);
            return describe(without_gil([&] { return p.project(layer, xr, stream_of(stream)); }));
          },
          py::arg("layer"), py::arg("x"), py::arg("stream"))
      .def(
          "publish",
          [](sd::Pooler& p, int b, uintptr_t stream) { without_gil([&] { p.publish(b, stream_of(stream)); }); },
          py::arg("b"), py::arg("stream"))
      .def(
          "gather",
          [](sd::Pooler& p, int layer, int b, uintptr_t stream) {
            return pooler_output(without_gil([&] { return p.gather(layer, b, stream_of(stream)); }));
          },
          py::arg("layer"), py::arg("b"), py::arg("stream"))
      .def(
          "run",
          [](sd::Pooler& p, int layer, const py::tuple& x, uintptr_t stream) {
            const sd::TensorRef xr = tensor_ref(x);
            return pooler_output(without_gil([&] { return p.run(layer, xr, stream_of(stream)); }));
          },
          py::arg("layer"), py::arg("x"), py::arg("stream"))
      .def("warm_up", [](sd::Pooler& p, uintptr_t stream) { p.warm_up(stream_of(stream)); },
           py::call_guard<py::gil_scoped_release>())
      .def("barrier", &sd::Pooler::barrier, py::call_guard<py::gil_scoped_release>())
      .def(
          "synchronize", [](sd::Pooler& p, uintptr_t stream) { p.mailbox().synchronize(stream_of(stream)); },
          py::call_guard<py::gil_scoped_release>())
      .def("timeout_report", [](sd::Pooler& p) { return p.mailbox().timeout_report(); })
      .def_property_readonly(
          "mailbox", [](sd::Pooler& p) -> sd::LamportMailbox& { return p.mailbox(); },
          py::return_value_policy::reference_internal)
      .def("gemm_choice", [](const sd::Pooler& p, int layer, int b) { return p.gemm_choice(layer, b).to_string(); })
      .def_property_readonly("tp", &sd::Pooler::tp)
      .def_property_readonly("rank", &sd::Pooler::rank)
      .def_property_readonly("hidden", &sd::Pooler::hidden)
      .def_property_readonly("pooled", &sd::Pooler::pooled)
      .def_property_readonly("capacity", &sd::Pooler::capacity)
      .def_property_readonly("device", &sd::Pooler::device)
      .def_property_readonly("layers", &sd::Pooler::layers)
      .def_property_readonly("batches", &sd::Pooler::batches)
      .def("is_nvfp4", &sd::Pooler::is_nvfp4);
}
