// Tests for headlab::plot over PLplot: each function writes a valid PNG / SVG / PDF of the expected
// size, NaN and empty data are still drawn, bad input and bad paths give clear errors, token labels
// with odd bytes are safe, two threads may plot at once, and nothing is printed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "plot/graph.h"
#include "plot/plot.h"
#include "tests/process_util.h"

namespace fs = std::filesystem;
using namespace headlab;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

class PlotTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return tmp_.path(name); }
  headlab::testing::TempDir tmp_{"headlab_plot"};
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// A PNG starts with its 8-byte signature and the IHDR chunk: length, "IHDR", width, height (big-endian).
std::pair<uint32_t, uint32_t> png_size(const std::string& path) {
  const std::string b = read_file(path);
  if (b.size() < 33) {
    ADD_FAILURE() << path << " has only " << b.size() << " bytes";
    return {0, 0};
  }
  EXPECT_EQ(b.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << path;
  EXPECT_EQ(b.substr(12, 4), "IHDR") << path;
  auto be32 = [&](size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<uint8_t>(b[at + i]);
    return v;
  };
  return {be32(16), be32(20)};
}

// cairo writes SVG colours as percentages: (68, 1, 84) is "rgb(26.666667%,0.392157%,32.941176%)".
std::string svg_rgb(int r, int g, int b) {
  std::string out = "rgb(";
  const int rgb[3] = {r, g, b};
  for (int i = 0; i < 3; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%f", rgb[i] * 100.0 / 255.0);
    std::string s = buf;
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
    out += s + (i == 2 ? "%)" : "%,");
  }
  return out;
}

// The message of the headlab::Error that f throws; a failure when it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no headlab::Error thrown";
  return "";
}

const std::string kBlue = svg_rgb(31, 119, 180);  // the first series (tab10)
const std::string kViridisLow = svg_rgb(0x44, 0x01, 0x54), kViridisHigh = svg_rgb(0xfd, 0xe7, 0x25);
const std::string kNanGrey = svg_rgb(192, 192, 192);

plot::LineChart timing_chart(int width = 800, int height = 500) {
  plot::LineChart ch;
  ch.title = "wrapper vs fused attention: time against tokens";
  ch.x_label = "tokens";
  ch.y_label = "time per call, ms";
  ch.log_x = ch.log_y = true;
  ch.width = width;
  ch.height = height;
  for (const char* name : {"wrapper forward", "fused forward"}) {
    plot::Series s{name, {}, {}};
    for (double t = 64; t <= 4096; t *= 2) s.x.push_back(t), s.y.push_back(0.01 * t / (s.name[0] == 'f' ? 2 : 1));
    ch.series.push_back(s);
  }
  return ch;
}

plot::Heatmap importance_map() {
  plot::Heatmap m;
  m.title = "head importance";
  m.x_label = "head";
  m.y_label = "layer";
  m.colorbar_label = "importance";
  m.rows = 2;
  m.cols = 3;
  m.values = {0.0, 0.25, 0.5, 0.75, 1.0, kNaN};
  m.annotate = true;
  return m;
}

plot::HeatmapGrid attention_grid(int64_t layers, int64_t heads, int64_t T) {
  plot::HeatmapGrid g;
  g.title = "attention weights";
  g.x_label = "key";
  g.y_label = "query";
  g.colorbar_label = "attention weight";
  g.grid_rows = layers;
  g.grid_cols = heads;
  for (int64_t p = 0; p < layers * heads; ++p) {
    plot::Heatmap m;
    m.title = "layer " + std::to_string(p / heads) + " head " + std::to_string(p % heads);
    m.rows = m.cols = T;
    for (int64_t t = 0; t < T; ++t) m.row_labels.push_back(std::string("t").append(std::to_string(t)));
    m.col_labels = m.row_labels;
    for (int64_t q = 0; q < T; ++q)
      for (int64_t k = 0; k < T; ++k) m.values.push_back(k <= q ? 1.0 / static_cast<double>(q + 1) : 0.0);
    g.panels.push_back(m);
  }
  return g;
}

// --- Line charts -------------------------------------------------------------------------------

TEST_F(PlotTest, LineChartPngHasTheRequestedSize) {
  plot::save_line_chart(timing_chart(640, 360), path("a.png"));
  EXPECT_EQ(png_size(path("a.png")), std::make_pair(640u, 360u));
  plot::save_line_chart(timing_chart(), path("b.png"));  // default 800 x 500
  EXPECT_EQ(png_size(path("b.png")), std::make_pair(800u, 500u));
  plot::LineChart big = timing_chart(2000, 1200);
  big.log_x = big.log_y = false;
  plot::save_line_chart(big, path("c.png"));
  EXPECT_EQ(png_size(path("c.png")), std::make_pair(2000u, 1200u));
}

TEST_F(PlotTest, SvgAndPdfGetPointsAtOneHundredPixelsPerInch) {
  plot::save_line_chart(timing_chart(800, 500), path("a.svg"));
  const std::string svg = read_file(path("a.svg"));
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("width=\"576pt\" height=\"360pt\""), std::string::npos) << svg.substr(0, 300);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  plot::save_line_chart(timing_chart(800, 500), path("a.pdf"));
  const std::string pdf = read_file(path("a.pdf"));
  EXPECT_EQ(pdf.rfind("%PDF-", 0), 0u);
  EXPECT_NE(pdf.find("/MediaBox [ 0 0 576 360 ]"), std::string::npos);
  EXPECT_NE(pdf.rfind("%%EOF"), std::string::npos);
}

TEST_F(PlotTest, NaNBreaksTheLineLikeMatplotlib) {
  plot::LineChart ch;
  ch.series.push_back({"loss", {1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}});
  plot::save_line_chart(ch, path("whole.svg"));
  ch.series[0].y[2] = kNaN;
  plot::save_line_chart(ch, path("broken.svg"));
  // One stroke per run of finite points, plus the legend's sample line.
  const std::string stroke = "stroke:" + kBlue;
  EXPECT_EQ(count(read_file(path("whole.svg")), stroke), 2u);
  EXPECT_EQ(count(read_file(path("broken.svg")), stroke), 3u);
  ch.series[0].x[0] = std::numeric_limits<double>::infinity();  // inf breaks it too, and log axes skip it
  ch.log_x = true;
  plot::save_line_chart(ch, path("inf.png"));
  EXPECT_EQ(png_size(path("inf.png")), std::make_pair(800u, 500u));
}

TEST_F(PlotTest, EmptySeriesAndEmptyChartsDrawEmptyAxes) {
  plot::LineChart ch = timing_chart();
  ch.series.push_back({"no data yet", {}, {}});
  ch.series.push_back({"all NaN", {1, 2}, {kNaN, kNaN}});
  plot::save_line_chart(ch, path("some_empty.png"));
  EXPECT_EQ(png_size(path("some_empty.png")), std::make_pair(800u, 500u));
  plot::LineChart none;
  none.title = "nothing to show";
  plot::save_line_chart(none, path("none.png"));
  EXPECT_EQ(png_size(path("none.png")), std::make_pair(800u, 500u));
  none.log_x = none.log_y = true;
  none.series.push_back({"", {}, {}});
  plot::save_line_chart(none, path("none_log.svg"));
  EXPECT_NE(read_file(path("none_log.svg")).find("<svg"), std::string::npos);
}

TEST_F(PlotTest, OneLonePointOrOneValueIsStillDrawn) {
  plot::LineChart ch;
  ch.width = 200;
  ch.height = 200;
  ch.series.push_back({"one", {3}, {7}});
  ch.series.push_back({"flat", {1, 2, 3}, {0, 0, 0}});
  plot::save_line_chart(ch, path("tiny.png"));
  EXPECT_EQ(png_size(path("tiny.png")), std::make_pair(200u, 200u));
  ch.log_x = ch.log_y = true;  // less than a decade, and one decade exactly: widened to whole decades
  ch.series[1].y = {10, 10, 10};
  plot::save_line_chart(ch, path("tiny_log.png"));
  EXPECT_EQ(png_size(path("tiny_log.png")), std::make_pair(200u, 200u));
}

TEST_F(PlotTest, LineChartErrorsNameTheProblem) {
  plot::LineChart ch = timing_chart();
  ch.series[1].x[1] = 0;
  EXPECT_NE(error_of([&] {
              plot::save_line_chart(ch, path("a.png"));
            }).find("save_line_chart: log_x needs x > 0; series 'fused forward' has x[1] = 0"),
            std::string::npos);
  ch = timing_chart();
  ch.series[0].y[3] = -1;
  EXPECT_NE(error_of([&] { plot::save_line_chart(ch, path("a.png")); }).find("log_y needs y > 0"), std::string::npos);
  ch = timing_chart();
  ch.series[0].y.pop_back();
  EXPECT_NE(error_of([&] {
              plot::save_line_chart(ch, path("a.png"));
            }).find("series 'wrapper forward' has 7 x values but 6 y values"),
            std::string::npos);
  ch = timing_chart(199, 500);
  EXPECT_NE(error_of([&] { plot::save_line_chart(ch, path("a.png")); }).find("size 199 x 500 is outside 200..8000"),
            std::string::npos);
  ch = timing_chart(800, 8001);
  EXPECT_NE(error_of([&] { plot::save_line_chart(ch, path("a.png")); }).find("outside 200..8000"), std::string::npos);
  EXPECT_FALSE(fs::exists(path("a.png")));
}

// Charts side by side: one picture as wide as both; an x mark widens the x range and its name is drawn.
TEST_F(PlotTest, ChartsSideBySideWithMarks) {
  plot::LineChart a = timing_chart(600, 400), b = timing_chart(400, 300);
  b.log_x = b.log_y = false;
  plot::save_line_charts({b}, path("unmarked.svg"));
  b.x_marks.push_back({1000, "phase"});  // inside the data's range: the same ticks, 5 more glyphs
  plot::save_line_charts({b}, path("marked.svg"));
  EXPECT_EQ(count(read_file(path("marked.svg")), "<use"), count(read_file(path("unmarked.svg")), "<use") + 5);
  plot::save_line_charts({a, b}, path("two.png"));
  EXPECT_EQ(png_size(path("two.png")), std::make_pair(1000u, 400u));
  b.x_marks[0].name = "phase change";
  b.x_marks[0].x = NAN;
  EXPECT_NE(error_of([&] {
              plot::save_line_charts({a, b}, path("bad.png"));
            }).find("x mark 'phase change' at nan"),
            std::string::npos);
  a.x_marks.push_back({-1, "before"});
  EXPECT_NE(error_of([&] { plot::save_line_chart(a, path("bad.png")); }).find("on a log x axis"), std::string::npos);
  EXPECT_NE(error_of([&] { plot::save_line_charts({}, path("bad.png")); }).find("no chart"), std::string::npos);
  EXPECT_FALSE(fs::exists(path("bad.png")));
}

// --- Paths and formats -------------------------------------------------------------------------

TEST_F(PlotTest, TheExtensionPicksTheFormat) {
  for (const char* name : {"a.jpg", "noext", "a.png.txt"})
    EXPECT_NE(error_of([&] {
                plot::save_line_chart(timing_chart(), path(name));
              }).find("from its extension: expected .png, .svg or .pdf"),
              std::string::npos)
        << name;
  EXPECT_TRUE(tmp_.entries().empty());
  plot::save_heatmap(importance_map(), path("m.pdf"));
  EXPECT_EQ(read_file(path("m.pdf")).rfind("%PDF-", 0), 0u);
}

TEST_F(PlotTest, UnwritablePathNamesThePathAndTheReason) {
  const std::string bad = path("missing/dir/x.png");
  for (const std::string& msg : {error_of([&] { plot::save_line_chart(timing_chart(), bad); }),
                                 error_of([&] { plot::save_heatmap(importance_map(), bad); }),
                                 error_of([&] { plot::save_heatmap_grid(attention_grid(1, 2, 3), bad); })}) {
    EXPECT_NE(msg.find("cannot write '" + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  }
  // A directory where the file should be.
  fs::create_directories(path("taken.png"));
  EXPECT_NE(error_of([&] { plot::save_heatmap(importance_map(), path("taken.png")); }).find("Is a directory"),
            std::string::npos);
}

TEST_F(PlotTest, ExistingFileIsReplacedAndKeptOnBadInput) {
  std::ofstream(path("a.png")) << "old";
  plot::LineChart bad = timing_chart();
  bad.series[0].x.pop_back();
  EXPECT_THROW(plot::save_line_chart(bad, path("a.png")), Error);
  EXPECT_EQ(read_file(path("a.png")), "old");  // bad input is refused before the file is touched
  plot::save_line_chart(timing_chart(), path("a.png"));
  EXPECT_EQ(png_size(path("a.png")), std::make_pair(800u, 500u));
}

// --- Heatmaps ----------------------------------------------------------------------------------

TEST_F(PlotTest, HeatmapIsAValidPictureWithTheColourMapEnds) {
  plot::save_heatmap(importance_map(), path("m.png"));
  const auto [w, h] = png_size(path("m.png"));
  EXPECT_GE(w, 200u);
  EXPECT_GE(h, 200u);
  EXPECT_LE(w, 1200u);
  EXPECT_LE(h, 1000u);
  plot::save_heatmap(importance_map(), path("m.svg"));
  const std::string svg = read_file(path("m.svg"));
  EXPECT_GE(count(svg, "fill:" + kViridisLow), 1u);  // 0.0 is the data minimum
  EXPECT_GE(count(svg, "fill:" + kViridisHigh), 1u);
  EXPECT_EQ(count(svg, "fill:" + kNanGrey), 1u);  // the one NaN cell
  // Values beyond vmin / vmax get the end colours.
  plot::Heatmap m = importance_map();
  m.values = {-5, 0.5, 0.5, 0.5, 0.5, 9};
  m.vmin = 0.0;
  m.vmax = 1.0;
  plot::save_heatmap(m, path("clamped.svg"));
  const std::string clamped = read_file(path("clamped.svg"));
  EXPECT_GE(count(clamped, "fill:" + kViridisLow), 1u);
  EXPECT_GE(count(clamped, "fill:" + kViridisHigh), 1u);
  EXPECT_EQ(count(clamped, "fill:" + kNanGrey), 0u);
}

TEST_F(PlotTest, AllNaNOrConstantHeatmapIsStillDrawn) {
  plot::Heatmap m = importance_map();
  m.values.assign(6, kNaN);
  plot::save_heatmap(m, path("nan.svg"));
  EXPECT_EQ(count(read_file(path("nan.svg")), "fill:" + kNanGrey), 6u);
  plot::save_heatmap(m, path("nan.png"));
  EXPECT_GE(png_size(path("nan.png")).first, 200u);
  m.values.assign(6, 3.0);  // one value: any range that contains it
  m.vmin.reset();
  plot::save_heatmap(m, path("flat.png"));
  EXPECT_GE(png_size(path("flat.png")).first, 200u);
  m.vmin = 5.0;  // a bound beyond all data is kept
  plot::save_heatmap(m, path("beyond.png"));
  EXPECT_GE(png_size(path("beyond.png")).first, 200u);
}

TEST_F(PlotTest, AnnotationsWriteValuesInBigEnoughCells) {
  plot::Heatmap m = importance_map();
  m.values = {0, 0, 0, 0, 0, 1};  // dark cells: their values are written in white
  m.annotate = false;
  plot::save_heatmap(m, path("plain.svg"));
  m.annotate = true;
  plot::save_heatmap(m, path("annotated.svg"));
  const std::string white = "fill:" + svg_rgb(255, 255, 255);
  EXPECT_GE(count(read_file(path("annotated.svg")), white), count(read_file(path("plain.svg")), white) + 5);
}

TEST_F(PlotTest, HeatmapErrorsNameTheProblem) {
  plot::Heatmap m = importance_map();
  m.values.pop_back();
  EXPECT_NE(error_of([&] {
              plot::save_heatmap(m, path("m.png"));
            }).find("save_heatmap: 5 values for a 2 x 3 heatmap (expected 6)"),
            std::string::npos);
  m = importance_map();
  m.rows = 0;
  EXPECT_NE(error_of([&] { plot::save_heatmap(m, path("m.png")); }).find("rows and cols must be in 1..8000"),
            std::string::npos);
  m = importance_map();
  m.row_labels = {"only one"};
  EXPECT_NE(error_of([&] { plot::save_heatmap(m, path("m.png")); }).find("1 row labels for 2 rows"), std::string::npos);
  m = importance_map();
  m.vmin = 1.0;
  m.vmax = 0.5;
  EXPECT_NE(error_of([&] { plot::save_heatmap(m, path("m.png")); }).find("vmin (1) must be less than vmax (0.5)"),
            std::string::npos);
  m.vmax = std::numeric_limits<double>::infinity();
  EXPECT_NE(error_of([&] { plot::save_heatmap(m, path("m.png")); }).find("must be finite"), std::string::npos);
  m = importance_map();  // 8000 rows fit the limit, but not with margins
  m.rows = 8000;
  m.cols = 1;
  m.values.assign(8000, 0.5);
  EXPECT_NE(error_of([&] { plot::save_heatmap(m, path("m.png")); }).find("pixels, outside 200..8000"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(path("m.png")));
}

// --- Grids of heatmaps -------------------------------------------------------------------------

TEST_F(PlotTest, GridDrawsEveryPanelWithOneSharedRange) {
  plot::HeatmapGrid g = attention_grid(2, 3, 6);
  g.panels[5].title = "layer 1 (pruned)";
  g.panels[5].values.assign(36, kNaN);
  plot::save_heatmap_grid(g, path("g.png"));
  const auto [w, h] = png_size(path("g.png"));
  EXPECT_GT(w, h);  // three panels side by side, two rows
  EXPECT_LE(w, 8000u);
  plot::save_heatmap_grid(g, path("g.svg"));
  const std::string svg = read_file(path("g.svg"));
  EXPECT_EQ(count(svg, "fill:" + kNanGrey), 36u);         // the pruned panel
  EXPECT_GE(count(svg, "fill:" + kViridisHigh), 5u);      // weight 1 = vmax in each live panel
  EXPECT_GE(count(svg, "fill:" + kViridisLow), 5u * 15);  // the masked upper triangles
}

TEST_F(PlotTest, GridMayLeaveTheLastRowShortAndStaysSane) {
  plot::HeatmapGrid g = attention_grid(2, 3, 4);
  g.panels.pop_back();
  g.panels.pop_back();
  plot::save_heatmap_grid(g, path("short.png"));
  EXPECT_GE(png_size(path("short.png")).first, 200u);
  plot::HeatmapGrid big = attention_grid(4, 4, 48);
  plot::save_heatmap_grid(big, path("big.png"));
  const auto [w, h] = png_size(path("big.png"));
  EXPECT_LE(w, 4000u);
  EXPECT_LE(h, 4000u);
}

TEST_F(PlotTest, GridErrorsNameThePanel) {
  plot::HeatmapGrid g = attention_grid(1, 2, 3);
  g.panels[1].values.pop_back();
  EXPECT_NE(error_of([&] {
              plot::save_heatmap_grid(g, path("g.png"));
            }).find("save_heatmap_grid: panel 1 ('layer 0 head 1'): 8 values for a 3 x 3 heatmap"),
            std::string::npos);
  g = attention_grid(1, 2, 3);
  g.grid_cols = 1;
  EXPECT_NE(error_of([&] { plot::save_heatmap_grid(g, path("g.png")); }).find("2 panels do not fit a 1 x 1 grid"),
            std::string::npos);
  g = attention_grid(1, 2, 3);
  g.vmin = 1;
  EXPECT_NE(error_of([&] { plot::save_heatmap_grid(g, path("g.png")); }).find("need finite vmin < vmax"),
            std::string::npos);
  g.panels.clear();
  g.vmin = 0;
  EXPECT_NE(error_of([&] { plot::save_heatmap_grid(g, path("g.png")); }).find("no panels"), std::string::npos);
}

// --- Text, threads, silence --------------------------------------------------------------------

TEST_F(PlotTest, TokenLabelsWithOddBytesAreDrawnLiterally) {
  // '#' is PLplot's escape character; the others are control bytes, markup and bytes beyond ASCII.
  const std::vector<std::string> tokens = {"#",
                                           "a\nb",
                                           "#u",
                                           "##(123)",
                                           "<b>&amp;",
                                           "\t",
                                           "\xff",
                                           "caf\xc3\xa9",
                                           std::string(1, '\0'),
                                           std::string(300, 'w')};
  plot::HeatmapGrid g = attention_grid(1, 1, static_cast<int64_t>(tokens.size()));
  g.title = "attention # of \"a\\nb\" \x01";
  g.panels[0].row_labels = g.panels[0].col_labels = tokens;
  plot::save_heatmap_grid(g, path("tokens.png"));
  EXPECT_GE(png_size(path("tokens.png")).first, 200u);
  plot::LineChart ch = timing_chart();
  ch.title = "#1 " + tokens[1];
  ch.series[0].name = "#";
  ch.series[1].name = tokens[7];
  ch.x_label = std::string(2000, '#');
  plot::save_line_chart(ch, path("tokens.svg"));
  EXPECT_NE(read_file(path("tokens.svg")).find("</svg>"), std::string::npos);
  // Unescaped, "#u#d#u#d" would be four superscript commands and draw nothing; escaped, its 8 glyphs.
  plot::LineChart empty;
  plot::save_line_chart(empty, path("untitled.svg"));
  empty.title = "#u#d#u#d";
  plot::save_line_chart(empty, path("titled.svg"));
  EXPECT_EQ(count(read_file(path("titled.svg")), "<use"), count(read_file(path("untitled.svg")), "<use") + 8);
}

TEST_F(PlotTest, TwoThreadsPlottingAtOnceBothSucceed) {
  std::vector<std::string> errors(2);
  auto work = [&](int t) {
    try {
      for (int i = 0; i < 4; ++i) {
        const std::string stem = path("t" + std::to_string(t) + "_" + std::to_string(i));
        plot::save_line_chart(timing_chart(600 + 100 * t, 400), stem + ".png");
        plot::save_heatmap(importance_map(), stem + ".svg");
        plot::save_heatmap_grid(attention_grid(1, 2, 4), stem + "_grid.png");
      }
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(t)] = e.what();
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  for (int t = 0; t < 2; ++t)
    for (int i = 0; i < 4; ++i) {
      const std::string stem = path("t" + std::to_string(t) + "_" + std::to_string(i));
      EXPECT_EQ(png_size(stem + ".png"), std::make_pair(600u + 100u * static_cast<uint32_t>(t), 400u));
      EXPECT_NE(read_file(stem + ".svg").find("</svg>"), std::string::npos);
      EXPECT_GE(png_size(stem + "_grid.png").first, 200u);
    }
}

TEST_F(PlotTest, NothingIsPrinted) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  plot::LineChart ch = timing_chart();
  ch.series[0].name = "#\n\xff";
  ch.series[0].y[2] = kNaN;
  plot::save_line_chart(ch, path("a.png"));
  plot::save_heatmap(importance_map(), path("m.svg"));
  plot::save_heatmap_grid(attention_grid(2, 2, 5), path("g.pdf"));
  EXPECT_THROW(plot::save_heatmap(importance_map(), path("nowhere/m.png")), Error);
  ch.log_y = true;
  ch.series[0].y[0] = 0;
  EXPECT_THROW(plot::save_line_chart(ch, path("b.png")), Error);
  const std::string out = ::testing::internal::GetCapturedStdout();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "");
  EXPECT_EQ(err, "");
}

// A command that draws a graph last (circuit) checks that Graphviz runs before its first result.
TEST_F(PlotTest, AMissingGraphvizIsFoundBeforeAnyGraphIsDrawn) {
  EXPECT_NO_THROW(plot::check_graphviz("circuit"));
  const std::string path_before = std::getenv("PATH") ? std::getenv("PATH") : "";
  fs::create_directories(path("empty_bin"));
  ::setenv("PATH", path("empty_bin").c_str(), 1);
  std::string error;
  try {
    plot::check_graphviz("circuit");
  } catch (const Error& e) {
    error = e.what();
  }
  ::setenv("PATH", path_before.c_str(), 1);
  EXPECT_NE(error.find("circuit: cannot run Graphviz's dot"), std::string::npos) << error;
}

}  // namespace
