// The attention explorer page (analysis/explorer.h): its data against the maps it was made from, that
// it needs no network, and, in a real browser (Debian's chromium driven through chromedriver by
// tests/browser/explorer_driver.py), that it shows the checkpoint's tokens and heads and that hovering
// a token highlights exactly the weights of attention.h5, on a GPT's page and on the cross-attention of an
// encoder-decoder's; that the address picks the head and follows the one chosen; and that a long prompt's
// hover row stays in its box. The screenshots stay in <build>/tests/artifacts/explorer*.png.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "analysis/explorer.h"
#include "io/checkpoint.h"
#include "io/h5file.h"
#include "tasks/task.h"
#include "tests/browser_util.h"
#include "tests/core_test_util.h"
#include "tests/process_util.h"
#include "tests/tiny_models.h"

namespace fs = std::filesystem;
using namespace headlab;
using namespace headlab::analysis;

namespace {

// A random 2-layer, 4-head reverse GPT as a checkpoint (the page does not care whether it learned).
std::string write_checkpoint(const std::string& path) {
  tasks::TaskOptions o;
  const auto task = tasks::make_task("reverse", o);
  const nn::DecoderConfig cfg = headlab::testing::tiny_gpt_config(
      headlab::testing::kFourHeadGpt.sized_for(task->vocab_size(), task->required_context_length()));
  manual_seed(5);
  nn::DecoderModel model(cfg);
  io::Checkpoint c;
  c.config = {{"model", cfg.to_json()},
              {"tokenizer", {{"type", "char"}, {"vocab", task->tokenizer().vocab()}}},
              {"task", {{"name", "reverse"}, {"options", tasks::options_to_map("reverse", o)}}}};
  c.model = io::snapshot_parameters(model);
  io::save_checkpoint(path, c);
  return path;
}

std::vector<uint8_t> base64_decode(const std::string& s) {
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : s) {
    const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char* p = ch == '=' ? nullptr : std::strchr(abc, ch);
    if (!p) continue;
    acc = acc << 6 | static_cast<uint32_t>(p - abc);
    if ((bits += 6) >= 8) out.push_back(static_cast<uint8_t>(acc >> (bits -= 8) & 0xff));
  }
  return out;
}

}  // namespace

TEST(Explorer, PageCarriesTheWeightsAndNeedsNoNetwork) {
  AttentionMaps m;
  m.layers = 1;
  m.heads = 2;
  m.T = 3;
  m.S = 3;
  m.layer_names = {"L0"};
  m.kept = {{0, 1}};
  m.weights = {1, 0, 0, 0.25f, 0.75f, 0, 0.1f, 0.2f, 0.7f, 1, 0, 0, 0.5f, 0.5f, 0, 0.3f, 0.3f, 0.4f};
  const std::vector<std::string> tokens = {"a", "</script>", "\"q\""};
  const std::string page = attention_explorer_html(m, tokens, "t", {{"importance", {{0.5, std::nan("")}}}});
  for (const char* external : {"http://", "https://", "src=", "href=", "@import"})
    EXPECT_EQ(page.find(external), std::string::npos) << external;
  EXPECT_EQ(page.find("</script>\""), std::string::npos) << "a token must not close the script element";
  const size_t start = page.find("const D = ") + 10, end = page.find(";\nconst decode = ");
  const nlohmann::json page_data = nlohmann::json::parse(page.substr(start, end - start));
  ASSERT_EQ(page_data["kinds"].size(), 1u);
  const nlohmann::json& d = page_data["kinds"][0];
  EXPECT_EQ(d["tokens"].get<std::vector<std::string>>(), tokens);
  EXPECT_EQ(d["scores"][0]["values"][0][0], 0.5);
  EXPECT_TRUE(d["scores"][0]["values"][0][1].is_null());
  const std::vector<uint8_t> bytes = base64_decode(d["weights"].get<std::string>());
  ASSERT_EQ(bytes.size(), 2 * m.weights.size());
  for (size_t i = 0; i < m.weights.size(); ++i) {
    const double w = (bytes[2 * i] | bytes[2 * i + 1] << 8) / kExplorerWeightScale;
    EXPECT_NEAR(w, m.weights[i], 0.5 / kExplorerWeightScale + 1e-9) << i;
  }
  EXPECT_NE(headlab::testing::error_of([&] { attention_explorer_html(m, {"a"}, "t"); }).find("1 tokens for maps of 3"),
            std::string::npos);
}

// What explorer_driver.py saw and did on `page` (hovering query `query`; `options`: its --kind, --hash, --click,
// --then-hash), or nothing when it had no browser (the test then skips).
std::optional<nlohmann::json> drive(const std::string& page, int query, const std::string& shot_name,
                                    const std::string& options = "") {
  return headlab::testing::run_page_driver("explorer_driver.py", page + " " + std::to_string(query), shot_name,
                                           options);
}

void run_headlab(const std::string& args) {
  const fs::path exe = fs::path(HEADLAB_BINARY_DIR) / "headlab";
  ASSERT_EQ(std::system((exe.string() + " " + args + " > /dev/null").c_str()), 0) << args;
}

bool browser_test_possible() {
  return fs::exists(fs::path(HEADLAB_BINARY_DIR) / "headlab") &&
         std::system("command -v python3 > /dev/null 2>&1") == 0;
}

TEST(Explorer, HoveringATokenInChromiumShowsItsRowOfAttentionH5) {
  if (!browser_test_possible()) GTEST_SKIP() << "needs build/headlab and python3";
  headlab::testing::TempDir tmp("headlab_explorer");
  const std::string ck = write_checkpoint(tmp.path("model.h5")), out = tmp.path("att");
  run_headlab("attention " + ck + " --prompt 31415 --out " + out);
  const int query = 3;
  const std::optional<nlohmann::json> driven = drive(out + "/attention.html", query, "explorer.png");
  if (!driven) GTEST_SKIP() << "no browser";
  const nlohmann::json& r = *driven;
  io::h5::Reader h5(out + "/attention.h5");
  const io::h5::Array w = h5.read("weights");  // (layers, heads, T, T)
  const int64_t L = w.shape[0], H = w.shape[1], T = w.shape[2];
  const nlohmann::json& shown = r["shown"];
  EXPECT_EQ(shown["T"], T);
  EXPECT_EQ(shown["layers"], L);
  EXPECT_EQ(shown["heads"], H);
  EXPECT_EQ(shown["thumbs"], L * H);
  EXPECT_EQ(shown["tokens"].get<std::vector<std::string>>(),
            nlohmann::json::parse(h5.attr_str("/", "tokens")).get<std::vector<std::string>>());
  // The pointer over query 3 of the left column: that row of layer 0 head 0 (the page's first view).
  const nlohmann::json& hovered = r["hovered"];
  EXPECT_EQ(hovered["state"]["hovered"], query);
  ASSERT_EQ(hovered["row"].size(), 1u);
  const std::vector<double> row = hovered["row"][0]["weights"].get<std::vector<double>>();
  const std::vector<float> expected = w.as<float>();
  ASSERT_EQ(static_cast<int64_t>(row.size()), T);
  for (int64_t k = 0; k < T; ++k)
    EXPECT_NEAR(row[static_cast<size_t>(k)], expected[static_cast<size_t>(query * T + k)], 1e-5) << k;
  EXPECT_NE(hovered["text"].get<std::string>().find("query 3"), std::string::npos);
}

TEST(Explorer, AnEncoderDecodersPageSwitchesToCrossAttention) {
  if (!browser_test_possible()) GTEST_SKIP() << "needs build/headlab and python3";
  headlab::testing::TempDir tmp("headlab_explorer_ed");
  run_headlab(
      "train --arch encoder-decoder --task reverse --emb-dim 16 --n-heads 2 --n-layers 2 --steps 2 "
      "--eval-every 2 --eval-batches 1 --batch-size 8 --threads 1 --out " +
      tmp.path("run"));
  const std::string out = tmp.path("att");
  run_headlab("attention " + tmp.path("run/checkpoint.h5") + " --prompt 31415 --max-new-tokens 3 --out " + out);
  const int query = 0;  // the decoder's bos: always there, whatever the barely trained model decodes
  const std::optional<nlohmann::json> driven = drive(out + "/attention.html", query, "explorer_cross.png", "--kind 2");
  if (!driven) GTEST_SKIP() << "no browser";
  const nlohmann::json& shown = (*driven)["shown"];
  io::h5::Reader h5(out + "/attention.h5");
  const io::h5::Array w = h5.read("cross/weights");  // (layers, heads, T, S): decoder queries, source keys
  const int64_t T = w.shape[2], S = w.shape[3];
  EXPECT_EQ(shown["kinds"], 3);
  EXPECT_EQ(shown["kind"], "encoder-decoder (cross) attention");
  EXPECT_EQ(shown["T"], T);
  EXPECT_EQ(shown["S"], S);
  EXPECT_EQ(S, 5);
  EXPECT_EQ(shown["key_tokens"].get<std::vector<std::string>>(),
            nlohmann::json::parse(h5.attr_str("cross", "key_tokens")).get<std::vector<std::string>>());
  EXPECT_EQ(shown["tokens"].get<std::vector<std::string>>(),
            nlohmann::json::parse(h5.attr_str("decoder", "tokens")).get<std::vector<std::string>>());
  EXPECT_EQ(shown["thumbs"], w.shape[0] * w.shape[1]);
  // The pointer over decoder query 0: its weights over the source words, layer 0 head 0.
  const nlohmann::json& hovered = (*driven)["hovered"];
  ASSERT_EQ(hovered["row"].size(), 1u);
  const std::vector<double> row = hovered["row"][0]["weights"].get<std::vector<double>>();
  const std::vector<float> expected = w.as<float>();
  ASSERT_EQ(static_cast<int64_t>(row.size()), S);
  for (int64_t k = 0; k < S; ++k)
    EXPECT_NEAR(row[static_cast<size_t>(k)], expected[static_cast<size_t>(query * S + k)], 1e-5) << k;
  // An address naming a cross-attention head opens that kind at that head.
  const std::optional<nlohmann::json> linked =
      drive(out + "/attention.html", query, "explorer_cross_linked.png", "--hash cross.L1H1");
  ASSERT_TRUE(linked);
  const nlohmann::json& opened = (*linked)["opened"];
  EXPECT_EQ(opened["state"]["kind"], 2) << opened;
  EXPECT_EQ(opened["state"]["layer"], 1);
  EXPECT_EQ(opened["state"]["head"], 1);
  EXPECT_EQ(opened["hash"], "#cross.L1H1");
}

// The address names the head shown: attention.html#L1H3 opens layer 1's head 3 (its hover row is that head's
// row of attention.h5), clicking a thumbnail rewrites the address, a typed #L1 overlays the layer's heads, and
// an address naming no head says so over the first view. On a 150-token prompt the hover row, longer than its
// box is wide, wraps inside it and the page is no wider than the window.
TEST(Explorer, TheAddressPicksTheHeadAndALongPromptsRowStaysInItsBox) {
  if (!browser_test_possible()) GTEST_SKIP() << "needs build/headlab and python3";
  headlab::testing::TempDir tmp("headlab_explorer_long");
  run_headlab("train --task chars --text " + std::string(HEADLAB_SOURCE_DIR) +
              "/data/tiny.txt --context-length 160 --emb-dim 16 --n-heads 4 --n-layers 2 --steps 1 "
              "--batch-size 2 --eval-every 1 --eval-batches 1 --threads 1 --out " +
              tmp.path("run"));
  const std::string text = headlab::testing::slurp(std::string(HEADLAB_SOURCE_DIR) + "/data/tiny.txt");
  std::string prompt = text.substr(text.find("From fairest"), 150);
  std::replace(prompt.begin(), prompt.end(), '\n', ' ');
  const std::string out = tmp.path("att");
  run_headlab("attention " + tmp.path("run/checkpoint.h5") + " --prompt " + headlab::testing::quote(prompt) +
              " --out " + out);
  const int query = 140;
  const std::optional<nlohmann::json> driven =
      drive(out + "/attention.html", query, "explorer_long.png", "--hash L1H3 --click 0,2 --then-hash L1");
  if (!driven) GTEST_SKIP() << "no browser";
  const nlohmann::json& r = *driven;
  EXPECT_EQ(r["opened"]["state"]["layer"], 1) << r["opened"];
  EXPECT_EQ(r["opened"]["state"]["head"], 3) << r["opened"];
  EXPECT_EQ(r["opened"]["hash"], "#L1H3");
  const std::string link = r["opened"]["link"];
  EXPECT_NE(link.find("link to this view: attention.html#L1H3"), std::string::npos) << link;
  EXPECT_NE(link.find("#L1H3 in the address opens layer L1, head 3"), std::string::npos) << link;

  io::h5::Reader h5(out + "/attention.h5");
  const io::h5::Array w = h5.read("weights");  // (layers, heads, T, T)
  const int64_t H = w.shape[1], T = w.shape[2];
  ASSERT_EQ(T, 150);
  const nlohmann::json& hovered = r["hovered"];
  EXPECT_EQ(hovered["state"]["hovered"], query);
  ASSERT_EQ(hovered["row"].size(), 1u);
  EXPECT_EQ(hovered["row"][0]["head"], 3);
  const std::vector<double> row = hovered["row"][0]["weights"].get<std::vector<double>>();
  const std::vector<float> expected = w.as<float>();
  ASSERT_EQ(static_cast<int64_t>(row.size()), T);
  for (int64_t k = 0; k < T; ++k)
    EXPECT_NEAR(row[static_cast<size_t>(k)], expected[static_cast<size_t>(((1 * H + 3) * T + query) * T + k)], 1e-5)
        << k;
  // The row's text is wider than its box in one line (a monospace character is > 6 pixels at 13px) ...
  const std::string shown = hovered["text"];
  size_t longest = 0;
  std::istringstream lines(shown);
  for (std::string line; std::getline(lines, line);) longest = std::max(longest, line.size());
  const nlohmann::json& layout = hovered["layout"];
  EXPECT_GT(6.0 * static_cast<double>(longest), layout["row"]["clientWidth"].get<double>()) << shown;
  // ... and stays inside it, the box inside the window, the page no wider than the window.
  EXPECT_LE(layout["row"]["scrollWidth"].get<double>(), layout["row"]["clientWidth"].get<double>()) << layout;
  EXPECT_LE(layout["row"]["right"].get<double>(), layout["side"]["right"].get<double>() + 1) << layout;
  EXPECT_LE(layout["side"]["right"].get<double>(), layout["viewport"].get<double>()) << layout;
  EXPECT_LE(layout["page"].get<double>(), layout["viewport"].get<double>()) << layout;

  EXPECT_EQ(r["clicked"]["hash"], "#L0H2") << r["clicked"];
  EXPECT_EQ(r["clicked"]["state"]["layer"], 0);
  EXPECT_EQ(r["clicked"]["state"]["head"], 2);
  EXPECT_EQ(r["rehashed"]["state"]["layer"], 1) << r["rehashed"];
  EXPECT_EQ(r["rehashed"]["state"]["head"], -1);  // all of L1's heads overlaid
  EXPECT_EQ(r["rehashed"]["hash"], "#L1");

  const std::optional<nlohmann::json> bad =
      drive(out + "/attention.html", 3, "explorer_bad_address.png", "--hash L9H9");
  ASSERT_TRUE(bad);
  EXPECT_EQ((*bad)["opened"]["state"]["layer"], 0);
  EXPECT_EQ((*bad)["opened"]["hash"], "#L0H0");
  EXPECT_NE((*bad)["opened"]["link"].get<std::string>().find("#L9H9 names no head of this page"), std::string::npos)
      << (*bad)["opened"];
}
