// Reading the PyTorch reference fixtures of tests/fixtures (written by tools/make_fixtures.py, layout in
// tests/fixtures/README.md) into tensors, and the deviation measures the parity suites report.
// Files are read with headlab::io::h5::Reader: fixture datasets are contiguous and unfiltered (no
// checksum to verify), string attributes fixed-length NULL-padded UTF-8; the Reader handles both.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/h5file.h"
#include "ops/ops.h"

namespace headlab::testing {

inline std::string fixture_path(const std::string& file) {
  return std::string(HEADLAB_SOURCE_DIR) + "/tests/fixtures/" + file;
}

// One entry of tests/fixtures/index.json.
struct FixtureEntry {
  std::string file, kind, module, call, description;
  nlohmann::json config;
};

inline std::vector<FixtureEntry> fixture_index() {
  std::ifstream in(fixture_path("index.json"));
  if (!in) throw Error("fixture index '" + fixture_path("index.json") + "' cannot be opened");
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<FixtureEntry> out;
  for (const auto& f : j.at("files")) {
    FixtureEntry e;
    e.file = f.at("file").get<std::string>();
    e.kind = f.at("kind").get<std::string>();
    e.module = f.value("module", std::string());
    e.call = f.value("call", std::string());
    e.description = f.value("description", std::string());
    e.config = f.contains("config") && !f.at("config").is_null() ? f.at("config") : nlohmann::json::object();
    out.push_back(std::move(e));
  }
  return out;
}

// A dataset as a CPU tensor: float64 datasets as f64, int64 ones as i64.
inline Tensor to_tensor(const io::h5::Array& a) {
  switch (a.dtype) {
    case io::h5::DType::f64:
      return tensor(a.as<double>(), a.shape);
    case io::h5::DType::i64:
      return tensor(a.as<int64_t>(), a.shape);
    case io::h5::DType::f32: {
      const std::vector<float> v = a.as<float>();
      return tensor(std::vector<double>(v.begin(), v.end()), a.shape);
    }
    default:
      throw Error(std::string("fixture: unsupported dtype ") + io::h5::dtype_name(a.dtype));
  }
}

// Every dataset of a module fixture, grouped as the README lays them out.
struct Fixture {
  std::string file, module, call, description;
  nlohmann::json config;
  std::map<std::string, Tensor> params, inputs, outputs, grad_inputs, grad_params;
};

inline Fixture load_fixture(const std::string& file) {
  io::h5::Reader r(fixture_path(file), "fixture");
  Fixture f;
  f.file = file;
  f.module = r.attr_str("/", "module");
  f.call = r.attr_str("/", "call");
  f.description = r.attr_str("/", "description");
  f.config = nlohmann::json::parse(r.attr_str("/", "config"));
  auto group = [&](const std::string& g, std::map<std::string, Tensor>& out) {
    if (!r.has(g)) return;
    for (const std::string& name : r.list_datasets_recursive(g)) out[name] = to_tensor(r.read(g + "/" + name));
  };
  group("params", f.params);
  group("inputs", f.inputs);
  group("outputs", f.outputs);
  group("grads/inputs", f.grad_inputs);
  group("grads/params", f.grad_params);
  return f;
}

// Largest |a - b| and the worst ratio |a - b| / max(1, |b|) (what the relative tolerance bounds).
struct Deviation {
  double max_abs = 0;
  double max_rel = 0;  // |a - b| / max(1, |b|)
  std::string where;   // the element with the worst ratio
};

inline Deviation deviation(const Tensor& actual, const Tensor& expected) {
  Deviation d;
  if (!actual.defined() || actual.shape() != expected.shape()) {
    d.max_abs = d.max_rel = INFINITY;
    d.where = "shape " + (actual.defined() ? shape_str(actual.shape()) : std::string("(undefined)")) + " != expected " +
              shape_str(expected.shape());
    return d;
  }
  const std::vector<double> a = actual.to_vector<double>(), b = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    const double abs_err = std::isfinite(a[i]) ? std::abs(a[i] - b[i]) : INFINITY;
    const double rel = abs_err / std::max(1.0, std::abs(b[i]));
    d.max_abs = std::max(d.max_abs, abs_err);
    if (rel > d.max_rel || (i == 0 && rel == 0)) {
      d.max_rel = rel;
      d.where = "element " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs expected " + std::to_string(b[i]);
    }
  }
  return d;
}

// |a - b| <= tol * max(1, |b|) everywhere, with the worst element reported on failure.
inline ::testing::AssertionResult close_rel(const Tensor& actual, const Tensor& expected, double tol) {
  const Deviation d = deviation(actual, expected);
  if (d.max_rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |a-b|/max(1,|b|) = " << d.max_rel << " > " << tol << " at " << d.where;
}

}  // namespace headlab::testing
