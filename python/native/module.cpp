// geoloco._native: the pybind11 module under the Python package (python/geoloco). It exposes
// OuterSession (outer_session.hpp) with tensors given by address and size, the site's
// collectives as Python callables, and geoloco's errors as Python exceptions. The torch side
// (dtype, device, layout checks, staging, torch.distributed) is python/geoloco/outer_loop.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <memory>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/shard.hpp"
#include "outer_optimizer/join_wire.hpp"
#include "outer_optimizer/membership.hpp"
#include "outer_optimizer/membership_driver.hpp"
#include "outer_optimizer/round_membership.hpp"
#include "python/native/outer_session.hpp"
#include "transport/transport.hpp"
#include "transport/transport_error.hpp"

namespace py = pybind11;

namespace geoloco::python {
namespace {

// A Python callable shared by C++ lambdas that may be copied or dropped without the GIL: the
// reference is released under the GIL.
using SharedFn = std::shared_ptr<py::function>;
SharedFn share(py::object f) {
  if (f.is_none()) return nullptr;
  return SharedFn(new py::function(f.cast<py::function>()), [](py::function* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
}

HostSiteCallbacks callbacks(py::object all_gather, py::object sum, py::object stage_in, py::object stage_out,
                            py::object reset) {
  HostSiteCallbacks cb;
  if (auto f = share(all_gather))
    cb.all_gather = [f](std::span<const std::byte> mine) {
      py::gil_scoped_acquire gil;
      py::object out = (*f)(py::bytes(reinterpret_cast<const char*>(mine.data()), mine.size()));
      std::vector<std::vector<std::byte>> all;
      for (auto item : out) {
        const std::string s = item.cast<std::string>();
        const auto* b = reinterpret_cast<const std::byte*>(s.data());
        all.emplace_back(b, b + s.size());
      }
      return all;
    };
  if (auto f = share(sum))
    cb.sum = [f](const std::vector<double>& v) {
      py::gil_scoped_acquire gil;
      return (*f)(v).cast<std::vector<double>>();
    };
  auto plain = [](py::object o) -> std::function<void()> {
    auto f = share(std::move(o));
    if (!f) return {};
    return [f] {
      py::gil_scoped_acquire gil;
      (*f)();
    };
  };
  cb.stage_in = plain(stage_in);
  cb.stage_out = plain(stage_out);
  cb.reset_inner_state = plain(reset);
  return cb;
}

// (name, data_ptr, numel, shape) tuples; a layout's have data_ptr 0 (names and shapes only).
std::vector<HostTensor> host_tensors(const std::vector<py::tuple>& items, bool layout = false) {
  std::vector<HostTensor> out;
  for (const auto& it : items) {
    if (it.size() != 4) throw InputError("a tensor is (name, data_ptr, numel, shape)");
    if (layout) {
      HostTensor t;
      t.name = it[0].cast<std::string>();
      t.numel = it[2].cast<int64_t>();
      t.shape = it[3].cast<std::vector<int64_t>>();
      out.push_back(std::move(t));
      continue;
    }
    HostTensor t;
    t.name = it[0].cast<std::string>();
    t.data = reinterpret_cast<float*>(it[1].cast<uintptr_t>());
    t.numel = it[2].cast<int64_t>();
    t.shape = it[3].cast<std::vector<int64_t>>();
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace
}  // namespace geoloco::python

PYBIND11_MODULE(_native, m) {
  using namespace geoloco;
  using namespace geoloco::python;
  m.doc() = "geoloco's outer loop under another program's inner loop (see the geoloco package).";

  // geoloco's errors, most general first (pybind11 tries the latest registered first).
  static py::exception<Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<InputError> input_error(m, "InputError", error.ptr());
  static py::exception<ConfigError> config_error(m, "ConfigError", input_error.ptr());
  static py::exception<transport::TransportError> transport_error(m, "TransportError", error.ptr());
  static py::exception<outer::QuorumLost> quorum_lost(m, "QuorumLost", error.ptr());
  static py::exception<outer::SiteLeftOut> site_left_out(m, "SiteLeftOut", error.ptr());
  static py::exception<outer::JoinError> join_error(m, "JoinError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ConfigError& e) {
      config_error(e.what());
    } catch (const InputError& e) {
      input_error(e.what());
    } catch (const transport::TransportError& e) {
      transport_error(e.what());
    } catch (const outer::QuorumLost& e) {
      quorum_lost(e.what());
    } catch (const outer::SiteLeftOut& e) {
      site_left_out(e.what());
    } catch (const outer::JoinError& e) {
      join_error(e.what());
    } catch (const Error& e) {
      error(e.what());
    }
  });

  py::class_<OuterSession>(m, "Session")
      .def(py::init([](const std::string& config, const std::vector<std::string>& sets, const std::string& site,
                       int rank, bool join, bool resume, uint64_t tokens_per_step, int64_t total_steps,
                       const std::vector<py::tuple>& tensors, const std::vector<py::tuple>& layout,
                       py::object all_gather, py::object sum, py::object stage_in, py::object stage_out,
                       py::object reset_inner_state) {
             SessionOptions o{config, sets, site, rank, join, resume, tokens_per_step, total_steps};
             auto t = host_tensors(tensors);
             auto model = host_tensors(layout, true);
             auto cb = callbacks(all_gather, sum, stage_in, stage_out, reset_inner_state);
             py::gil_scoped_release nogil;  // connecting waits for the other sites
             return std::make_unique<OuterSession>(o, std::move(t), std::move(model), std::move(cb));
           }),
           py::arg("config"), py::arg("sets"), py::arg("site"), py::arg("rank"), py::arg("join"), py::arg("resume"),
           py::arg("tokens_per_step"), py::arg("total_steps"), py::arg("tensors"), py::arg("layout"),
           py::arg("all_gather"), py::arg("sum"), py::arg("stage_in"), py::arg("stage_out"),
           py::arg("reset_inner_state"))
      .def("join", &OuterSession::join, py::call_guard<py::gil_scoped_release>())
      .def("resume",
           [](OuterSession& s) -> py::object {
             std::optional<std::pair<int64_t, std::vector<uint8_t>>> r;
             {
               py::gil_scoped_release nogil;
               r = s.resume();
             }
             if (!r) return py::none();
             return py::make_tuple(r->first,
                                   py::bytes(reinterpret_cast<const char*>(r->second.data()), r->second.size()));
           })
      .def("save_checkpoint",
           [](OuterSession& s, int64_t step, py::bytes inner) {
             std::string b = inner;
             py::gil_scoped_release nogil;
             s.save_checkpoint(step, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b.data()), b.size()));
           })
      .def_property_readonly("checkpoint_every", &OuterSession::checkpoint_every)
      .def("trains_step", &OuterSession::trains_step, py::call_guard<py::gil_scoped_release>())
      .def("after_step", &OuterSession::after_step, py::call_guard<py::gil_scoped_release>())
      .def("finish",
           [](OuterSession& s, int64_t step) {
             nlohmann::json j;
             {
               py::gil_scoped_release nogil;
               j = s.finish(step);
             }
             return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
           })
      .def("metrics", [](OuterSession& s) { return s.metrics().dump(); })
      .def("close", &OuterSession::close, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("total_steps", &OuterSession::total_steps)
      .def_property_readonly("in_place", &OuterSession::in_place)
      .def_property_readonly("log_every", &OuterSession::log_every)
      .def_property_readonly("output_dir", &OuterSession::output_dir)
      .def_property_readonly("global_weights_hash",
                             [](const OuterSession& s) { return hex64(s.global_weights_hash()); });

  m.def(
      "shard_range",
      [](int64_t total, int rank, int ranks) {
        const ShardRange r = shard_of(total, rank, ranks);
        return py::make_tuple(r.offset, r.count);
      },
      py::arg("total"), py::arg("rank"), py::arg("ranks"),
      "(offset, count): rank `rank`'s shard of `total` flat values over `ranks` ranks (geoloco's rule).");
}
