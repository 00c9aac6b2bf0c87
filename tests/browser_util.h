// The page drivers of tests/browser/ (Debian's chromium through chromedriver) run from a suite.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "tests/process_util.h"

namespace headlab::testing {

// `python3 tests/browser/<driver> <before> <shot> <after>`, the screenshot written to
// <build>/tests/artifacts/<shot_name>: the JSON it printed, or nothing when it had no browser (exit 77: the test then
// skips, saying why).
inline std::optional<nlohmann::json> run_page_driver(const std::string& driver, const std::string& before,
                                                     const std::string& shot_name, const std::string& after = "") {
  namespace fs = std::filesystem;
  TempDir tmp("headlab_driver");
  const fs::path artifacts = fs::path(HEADLAB_BINARY_DIR) / "tests" / "artifacts";
  fs::create_directories(artifacts);
  const std::string result = tmp.path("driver.json"), shot = (artifacts / shot_name).string();
  const std::string cmd = std::string("python3 ") + HEADLAB_SOURCE_DIR + "/tests/browser/" + driver + " " + before +
                          " " + shot + " " + after;
  const int rc = std::system((cmd + " > " + result + " 2> " + tmp.path("driver.err")).c_str());
  const std::string err = slurp(tmp.path("driver.err"));
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) {
    std::cout << "skipping the browser part: " << err << "\n";
    return std::nullopt;
  }
  EXPECT_EQ(rc, 0) << err;
  EXPECT_GT(fs::file_size(shot), 1000u);
  nlohmann::json r;
  std::ifstream(result) >> r;
  return r;
}

}  // namespace headlab::testing
