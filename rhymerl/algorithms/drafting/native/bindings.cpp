// pybind11 bindings: rhymerl.algorithms.drafting._suffix_index. Thin: arrays in, arrays out, the GIL
// released around every call that loops over tokens or sequences. The typed Python API is
// rhymerl.algorithms.drafting.index; this module is its engine.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <Python.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

#include "suffix_index.hpp"

namespace py = pybind11;
using rhymerl::Drafter;
using rhymerl::DrafterParams;
using rhymerl::GroupIndex;
using rhymerl::SuffixIndex;

namespace {

struct GroupFeed {
  std::shared_ptr<GroupIndex> group;
  GroupIndex::Cursor cursor;
  uint64_t fed = 0;
};

template <typename T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;

// A one-dimensional input array of T. Arrays that already have the right dtype and layout are used
// in place (a few tens of nanoseconds); anything else (lists, other integer widths) is converted
// once, like numpy.ascontiguousarray(x, dtype=T). pybind11's array_t caster would always take the
// slower conversion path, which dominates a batch-of-one engine step.
template <typename T>
struct In {
  py::object keep;
  const T* ptr = nullptr;
  std::size_t size = 0;
};

template <typename T>
constexpr char kind_of() {
  return std::is_floating_point<T>::value ? 'f' : (std::is_signed<T>::value ? 'i' : 'u');
}

template <typename T>
In<T> in1d(const py::handle& obj, const char* name) {
  In<T> r;
  if (py::isinstance<py::array>(obj)) {  // never default-construct py::array: that allocates one
    const auto a = py::reinterpret_borrow<py::array>(obj);
    if (a.ndim() == 1 && a.itemsize() == static_cast<py::ssize_t>(sizeof(T)) &&
        a.dtype().kind() == kind_of<T>() && (a.flags() & py::array::c_style)) {
      r.ptr = static_cast<const T*>(a.data());
      r.size = static_cast<std::size_t>(a.size());
      return r;  // the caller's reference keeps it alive for the call
    }
  }
  auto converted = Arr<T>::ensure(obj);
  if (!converted) throw py::type_error(std::string(name) + ": expected a one-dimensional array of numbers");
  if (converted.ndim() != 1) throw py::value_error(std::string(name) + " must be one-dimensional");
  r.ptr = converted.data();
  r.size = static_cast<std::size_t>(converted.size());
  r.keep = std::move(converted);
  return r;
}

// A writable, C-contiguous one-dimensional output array of exactly T.
template <typename T>
T* out1d(const py::handle& obj, const char* name, std::size_t& size) {
  if (!py::isinstance<py::array>(obj)) throw py::type_error(std::string(name) + " must be a numpy array");
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (a.ndim() != 1 || a.itemsize() != static_cast<py::ssize_t>(sizeof(T)) || a.dtype().kind() != kind_of<T>() ||
      !(a.flags() & py::array::c_style) || !a.writeable()) {
    throw py::type_error(std::string(name) + " must be a writable contiguous one-dimensional " +
                         (sizeof(T) == 8 ? "int64" : "int32") + " array");
  }
  size = static_cast<std::size_t>(a.size());
  return static_cast<T*>(a.mutable_data());
}

template <typename T>
py::array_t<T> fresh(const T* data, std::size_t n) {
  py::array_t<T> out(static_cast<py::ssize_t>(n));
  if (n) std::memcpy(out.mutable_data(), data, n * sizeof(T));
  return out;
}

uint32_t as_u32(int64_t v, const char* name) {
  if (v < 0 || v > 0xFFFFFFFFll) throw py::value_error(std::string(name) + " out of range");
  return static_cast<uint32_t>(v);
}

struct Batch {
  In<int64_t> handles;
  In<int64_t> offsets;
  In<int32_t> tokens;
};

Batch batch_in(const py::handle& handles, const py::handle& offsets, const py::handle& tokens) {
  Batch b{in1d<int64_t>(handles, "handles"), in1d<int64_t>(offsets, "offsets"), in1d<int32_t>(tokens, "tokens")};
  if (b.offsets.size != b.handles.size + 1) {
    throw py::value_error("offsets must have len(handles) + 1 entries, got " + std::to_string(b.offsets.size) +
                          " for " + std::to_string(b.handles.size) + " handles");
  }
  if (static_cast<std::size_t>(b.offsets.ptr[b.handles.size]) != b.tokens.size || b.offsets.ptr[b.handles.size] < 0) {
    throw py::value_error("offsets[-1] must equal len(tokens) (" + std::to_string(b.tokens.size) + "), got " +
                          std::to_string(b.offsets.ptr[b.handles.size]));
  }
  return b;
}

// An optional per-handle int32 array (accepted counts, draft caps); nullptr for None.
const int32_t* per_handle(const py::handle& values, std::size_t n, In<int32_t>& holder, const char* name) {
  if (values.is_none()) return nullptr;
  holder = in1d<int32_t>(values, name);
  if (holder.size != n) throw py::value_error(std::string(name) + " must have one entry per handle");
  return holder.ptr;
}

// Per-thread scratch for drafts returned as fresh arrays (no allocation per call once warm).
struct Scratch {
  std::vector<int64_t> offsets;
  std::vector<int32_t> tokens;
  void fit(std::size_t n, std::size_t cap) {
    if (offsets.size() < n + 1) offsets.resize(n + 1);
    if (tokens.size() < cap) tokens.resize(cap);
  }
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

py::tuple fresh_pair(const Scratch& s, std::size_t n, std::size_t total) {
  return py::make_tuple(fresh(s.offsets.data(), n + 1), fresh(s.tokens.data(), total));
}

}  // namespace

PYBIND11_MODULE(_suffix_index, m) {
  m.doc() = "Native HistoSpec index (reward-aware suffix automaton) and batched AIMD drafter.";
  m.attr("FORMAT_VERSION") = rhymerl::kFormatVersion;
  m.attr("HEADER_SIZE") = rhymerl::kHeaderSize;
  m.attr("MAX_TOKENS") = rhymerl::kMaxTokens - 1;
  py::register_exception<rhymerl::FormatError>(m, "IndexFormatError", PyExc_ValueError);

  m.def(
      "crc32",
      [](py::buffer data) {
        py::buffer_info info = data.request();
        const auto* p = static_cast<const uint8_t*>(info.ptr);
        const auto n = static_cast<std::size_t>(info.size * info.itemsize);
        py::gil_scoped_release nogil;
        return rhymerl::crc32(p, n);
      },
      py::arg("data"), "CRC-32 of a contiguous buffer (equals zlib.crc32).");

  py::class_<SuffixIndex, std::shared_ptr<SuffixIndex>>(m, "SuffixIndex")
      .def_static(
          "build",
          [](const py::object& tokens, const py::object& offsets, const py::object& rewards, bool reward_weighted) {
            auto t = in1d<int32_t>(tokens, "tokens");
            auto o = in1d<int64_t>(offsets, "offsets");
            auto r = in1d<double>(rewards, "rewards");
            if (o.size != r.size + 1) throw py::value_error("offsets must have len(rewards) + 1 entries");
            if (o.ptr[r.size] < 0 || static_cast<std::size_t>(o.ptr[r.size]) != t.size) {
              throw py::value_error("offsets[-1] must equal len(tokens)");
            }
            py::gil_scoped_release nogil;
            return SuffixIndex::build(t.ptr, o.ptr, r.size, r.ptr, reward_weighted);
          },
          py::arg("tokens"), py::arg("offsets"), py::arg("rewards"), py::arg("reward_weighted"))
      .def_static(
          "from_bytes",
          [](py::buffer data) {
            py::buffer_info info = data.request();
            if (info.ndim > 1) throw py::value_error("history index bytes must be a flat buffer");
            const bool contiguous = info.ndim == 0 || info.strides.empty() || info.strides[0] == info.itemsize;
            if (!contiguous) throw py::value_error("history index bytes must be contiguous");
            const auto* p = static_cast<const uint8_t*>(info.ptr);
            const auto n = static_cast<std::size_t>(info.size * info.itemsize);
            py::gil_scoped_release nogil;
            return SuffixIndex::load(p, n);
          },
          py::arg("data"))
      .def("to_bytes",
           [](const SuffixIndex& self) {
             const std::size_t n = self.serialized_size();
             PyObject* raw = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n));
             if (raw == nullptr) throw py::error_already_set();
             py::bytes out = py::reinterpret_steal<py::bytes>(raw);
             auto* p = reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(raw));
             {
               py::gil_scoped_release nogil;
               self.serialize_into(p);
             }
             return out;
           })
      .def(
          "draft",
          [](const SuffixIndex& self, const py::object& context, int64_t max_tokens, int64_t prefix_max,
             int64_t prefix_min, double min_prob) {
            auto c = in1d<int32_t>(context, "context");
            const uint32_t cap = as_u32(max_tokens, "max_tokens");
            const uint32_t pmax = as_u32(prefix_max, "prefix_max");
            const uint32_t pmin = as_u32(prefix_min, "prefix_min");
            if (pmin < 1 || pmax < pmin) throw py::value_error("need 1 <= prefix_min <= prefix_max");
            if (!(min_prob >= 0.0 && min_prob <= 1.0)) throw py::value_error("min_prob must be in [0, 1]");
            std::vector<int32_t> out(cap);
            uint32_t k = 0;
            {
              py::gil_scoped_release nogil;
              uint32_t state = 0;
              uint32_t len = 0;
              for (std::size_t i = 0; i < c.size; ++i) state = self.advance(state, len, c.ptr[i], pmax);
              k = self.draft(state, len, pmin, out.data(), cap, min_prob);
            }
            return fresh(out.data(), k);
          },
          py::arg("context"), py::arg("max_tokens"), py::arg("prefix_max"), py::arg("prefix_min"),
          py::arg("min_prob") = 0.0)
      .def(
          "priority",
          [](const SuffixIndex& self, const py::object& tokens) -> std::optional<std::pair<uint64_t, uint32_t>> {
            auto t = in1d<int32_t>(tokens, "tokens");
            const uint32_t s = self.locate(t.ptr, t.size);
            if (s == rhymerl::kNone) return std::nullopt;
            return std::make_pair(self.weight(s), self.count(s));
          },
          py::arg("tokens"))
      .def(
          "oracle_accepted",
          [](const SuffixIndex& self, const py::object& tokens, int64_t prefix) {
            auto t = in1d<int32_t>(tokens, "tokens");
            const uint32_t k = as_u32(prefix, "prefix");
            py::gil_scoped_release nogil;
            return self.oracle_accepted(t.ptr, t.size, k);
          },
          py::arg("tokens"), py::arg("prefix"))
      .def_property_readonly("n_states", &SuffixIndex::n_states)
      .def_property_readonly("n_edges", &SuffixIndex::n_edges)
      .def_property_readonly("n_tokens", &SuffixIndex::n_tokens)
      .def_property_readonly("n_responses", &SuffixIndex::n_responses)
      .def_property_readonly("reward_weighted", &SuffixIndex::reward_weighted)
      .def_property_readonly("memory_bytes", &SuffixIndex::memory_bytes)
      .def_property_readonly("serialized_size", &SuffixIndex::serialized_size);

  py::class_<GroupIndex, std::shared_ptr<GroupIndex>>(m, "GroupIndex")
      .def(py::init([](int64_t depth) { return std::make_shared<GroupIndex>(as_u32(depth, "depth")); }),
           py::arg("depth"))
      .def(
          "extend",
          [](GroupIndex& self, const py::object& tokens) {
            auto t = in1d<int32_t>(tokens, "tokens");
            py::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(self.mutex());
            GroupIndex::Cursor cursor = self.cursor();
            for (std::size_t i = 0; i < t.size; ++i) self.append(cursor, t.ptr[i]);
          },
          py::arg("tokens"), "Append a whole response (a sequence of its own).")
      .def_property_readonly("depth", &GroupIndex::depth)
      .def_property_readonly("n_nodes", &GroupIndex::n_nodes)
      .def_property_readonly("n_tokens", &GroupIndex::n_tokens)
      .def_property_readonly("memory_bytes", &GroupIndex::memory_bytes);

  // One response of the group generated elsewhere (a sibling on another rollout worker), appended
  // as its tokens arrive: the response's own cursor, under the group's mutex.
  py::class_<GroupFeed>(m, "GroupFeed")
      .def(py::init([](std::shared_ptr<GroupIndex> group) {
             if (!group) throw std::invalid_argument("a feed needs a group index");
             GroupFeed feed{group, group->cursor(), 0};
             return feed;
           }),
           py::arg("group"))
      .def(
          "append",
          [](GroupFeed& self, const py::object& tokens) {
            auto t = in1d<int32_t>(tokens, "tokens");
            py::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(self.group->mutex());
            for (std::size_t i = 0; i < t.size; ++i) self.group->append(self.cursor, t.ptr[i]);
            self.fed += t.size;
          },
          py::arg("tokens"), "Append the response's next tokens.")
      .def_property_readonly("fed", [](const GroupFeed& self) { return self.fed; });

  py::class_<Drafter>(m, "Drafter")
      .def(py::init([](int64_t prefix_max, int64_t prefix_min, int64_t window_initial, int64_t window_step,
                       int64_t window_max, double min_prob) {
             DrafterParams p;
             p.prefix_max = as_u32(prefix_max, "prefix_max");
             p.prefix_min = as_u32(prefix_min, "prefix_min");
             p.window_initial = as_u32(window_initial, "window_initial");
             p.window_step = as_u32(window_step, "window_step");
             p.window_max = as_u32(window_max, "window_max");
             p.min_prob = min_prob;
             return new Drafter(p);
           }),
           py::arg("prefix_max"), py::arg("prefix_min"), py::arg("window_initial"), py::arg("window_step"),
           py::arg("window_max"), py::arg("min_prob") = 0.0)
      .def(
          "add",
          [](Drafter& self, std::shared_ptr<SuffixIndex> index, std::shared_ptr<GroupIndex> group,
             const py::object& context) {
            auto c = in1d<int32_t>(context, "context");
            py::gil_scoped_release nogil;
            return self.add(std::move(index), std::move(group), c.ptr, c.size);
          },
          py::arg("index").none(true), py::arg("group").none(true), py::arg("context"))
      .def(
          "remove",
          [](Drafter& self, const py::object& handles) {
            auto h = in1d<int64_t>(handles, "handles");
            self.remove(h.ptr, h.size);
          },
          py::arg("handles"))
      .def(
          "feed",
          [](Drafter& self, const py::object& handles, const py::object& offsets, const py::object& tokens) {
            Batch b = batch_in(handles, offsets, tokens);
            py::gil_scoped_release nogil;
            self.feed(b.handles.ptr, b.handles.size, b.offsets.ptr, b.tokens.ptr);
          },
          py::arg("handles"), py::arg("offsets"), py::arg("tokens"))
      .def(
          "report",
          [](Drafter& self, const py::object& handles, const py::object& accepted) {
            auto h = in1d<int64_t>(handles, "handles");
            In<int32_t> holder;
            const int32_t* a = per_handle(accepted, h.size, holder, "accepted");
            if (a == nullptr) throw py::type_error("accepted must be an array, not None");
            py::gil_scoped_release nogil;
            self.report(h.ptr, h.size, a);
          },
          py::arg("handles"), py::arg("accepted"))
      .def(
          "draft",
          [](Drafter& self, const py::object& handles, const py::object& max_tokens) {
            auto h = in1d<int64_t>(handles, "handles");
            In<int32_t> caps_holder;
            const int32_t* caps = per_handle(max_tokens, h.size, caps_holder, "max_tokens");
            Scratch& s = scratch();
            const std::size_t cap = h.size * self.params().window_max;
            s.fit(h.size, cap);
            std::size_t total = 0;
            {
              py::gil_scoped_release nogil;
              total = self.draft(h.ptr, h.size, caps, s.offsets.data(), s.tokens.data(), cap);
            }
            return fresh_pair(s, h.size, total);
          },
          py::arg("handles"), py::arg("max_tokens") = py::none())
      .def(
          "step",
          [](Drafter& self, const py::object& handles, const py::object& offsets, const py::object& tokens,
             const py::object& accepted, const py::object& max_tokens) {
            Batch b = batch_in(handles, offsets, tokens);
            const std::size_t n = b.handles.size;
            In<int32_t> holder;
            const int32_t* a = per_handle(accepted, n, holder, "accepted");
            In<int32_t> caps_holder;
            const int32_t* caps = per_handle(max_tokens, n, caps_holder, "max_tokens");
            Scratch& s = scratch();
            const std::size_t cap = n * self.params().window_max;
            s.fit(n, cap);
            std::size_t total = 0;
            {
              py::gil_scoped_release nogil;
              total = self.step(b.handles.ptr, n, a, b.offsets.ptr, b.tokens.ptr, caps, s.offsets.data(),
                                s.tokens.data(), cap);
            }
            return fresh_pair(s, n, total);
          },
          py::arg("handles"), py::arg("offsets"), py::arg("tokens"), py::arg("accepted") = py::none(),
          py::arg("max_tokens") = py::none())
      .def(
          "step_into",
          [](Drafter& self, const py::object& handles, const py::object& offsets, const py::object& tokens,
             const py::object& accepted, const py::object& out_offsets, const py::object& out_tokens,
             const py::object& max_tokens) {
            Batch b = batch_in(handles, offsets, tokens);
            const std::size_t n = b.handles.size;
            In<int32_t> holder;
            const int32_t* a = per_handle(accepted, n, holder, "accepted");
            In<int32_t> caps_holder;
            const int32_t* caps = per_handle(max_tokens, n, caps_holder, "max_tokens");
            std::size_t n_off = 0;
            std::size_t cap = 0;
            int64_t* oo = out1d<int64_t>(out_offsets, "out_offsets", n_off);
            int32_t* ot = out1d<int32_t>(out_tokens, "out_tokens", cap);
            if (n_off < n + 1) throw py::value_error("out_offsets needs len(handles) + 1 entries");
            py::gil_scoped_release nogil;
            return self.step(b.handles.ptr, n, a, b.offsets.ptr, b.tokens.ptr, caps, oo, ot, cap);
          },
          py::arg("handles"), py::arg("offsets"), py::arg("tokens"), py::arg("accepted"), py::arg("out_offsets"),
          py::arg("out_tokens"), py::arg("max_tokens") = py::none())
      .def(
          "inspect",
          [](const Drafter& self, const py::object& handles) {
            auto h = in1d<int64_t>(handles, "handles");
            py::array_t<int64_t> out({static_cast<py::ssize_t>(h.size), static_cast<py::ssize_t>(5)});
            self.inspect(h.ptr, h.size, out.mutable_data());
            return out;
          },
          py::arg("handles"))
      .def("__len__", &Drafter::size)
      .def_property_readonly("prefix_max", [](const Drafter& d) { return d.params().prefix_max; })
      .def_property_readonly("prefix_min", [](const Drafter& d) { return d.params().prefix_min; })
      .def_property_readonly("window_initial", [](const Drafter& d) { return d.params().window_initial; })
      .def_property_readonly("window_step", [](const Drafter& d) { return d.params().window_step; })
      .def_property_readonly("window_max", [](const Drafter& d) { return d.params().window_max; })
      .def_property_readonly("min_prob", [](const Drafter& d) { return d.params().min_prob; });

  m.def(
      "aimd_update",
      [](py::array_t<int32_t, py::array::c_style>& windows, const py::object& drafted, const py::object& accepted,
         int64_t initial, int64_t step, int64_t max) {
        if (windows.ndim() != 1) throw py::value_error("windows must be one-dimensional");
        auto d = in1d<int32_t>(drafted, "drafted");
        auto a = in1d<int32_t>(accepted, "accepted");
        const auto n = static_cast<std::size_t>(windows.shape(0));
        if (d.size != n || a.size != n) throw py::value_error("drafted and accepted need one entry per window");
        const uint32_t lo = as_u32(initial, "initial");
        const uint32_t up = as_u32(step, "step");
        const uint32_t hi = as_u32(max, "max");
        if (lo < 1 || hi < lo) throw py::value_error("need 1 <= initial <= max");
        int32_t* w = windows.mutable_data();
        for (std::size_t i = 0; i < n; ++i) {
          if (w[i] < 0 || d.ptr[i] < 0 || a.ptr[i] < 0 || a.ptr[i] > d.ptr[i]) {
            throw py::value_error("windows, drafted and accepted must be >= 0 with accepted <= drafted");
          }
        }
        for (std::size_t i = 0; i < n; ++i) {
          w[i] = static_cast<int32_t>(rhymerl::aimd_next(static_cast<uint32_t>(w[i]), static_cast<uint32_t>(d.ptr[i]),
                                                         static_cast<uint32_t>(a.ptr[i]), lo, up, hi));
        }
      },
      py::arg("windows"), py::arg("drafted"), py::arg("accepted"), py::arg("initial"), py::arg("step"),
      py::arg("max"));

  m.def(
      "ngram_draft",
      [](const Arr<int32_t>& contexts, const py::object& lengths, const py::object& windows, int64_t min_n,
         int64_t max_n) {
        if (contexts.ndim() != 2) throw py::value_error("contexts must be two-dimensional [batch, max_len]");
        auto l = in1d<int64_t>(lengths, "lengths");
        auto w = in1d<int32_t>(windows, "windows");
        const auto batch = static_cast<std::size_t>(contexts.shape(0));
        const auto stride = static_cast<std::size_t>(contexts.shape(1));
        if (l.size != batch || w.size != batch) {
          throw py::value_error("lengths and windows need one entry per context row");
        }
        for (std::size_t i = 0; i < batch; ++i) {
          if (l.ptr[i] < 0 || static_cast<std::size_t>(l.ptr[i]) > stride) throw py::value_error("lengths out of range");
        }
        const uint32_t lo = as_u32(min_n, "min_n");
        const uint32_t hi = as_u32(max_n, "max_n");
        if (lo < 1 || hi < lo) throw py::value_error("need 1 <= min_n <= max_n");
        thread_local std::vector<int64_t> offsets;
        thread_local std::vector<int32_t> out;
        const int32_t* c = contexts.data();
        {
          py::gil_scoped_release nogil;
          rhymerl::ngram_draft(c, batch, stride, l.ptr, w.ptr, lo, hi, offsets, out);
        }
        return py::make_tuple(fresh(offsets.data(), batch + 1), fresh(out.data(), out.size()));
      },
      py::arg("contexts"), py::arg("lengths"), py::arg("windows"), py::arg("min_n"), py::arg("max_n"),
      "n-gram baseline: per row, the most recent longest earlier match of the context's suffix.");
}
