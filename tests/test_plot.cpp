// Tests for train/plot.h: each picture is written to a temporary directory, decoded back with
// stb_image and checked for size, content (not blank, series and colour-map colours present) and
// for the errors promised on bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "autograd/error.h"
#include "train/plot.h"

// stb_image's implementation lives in Debian's libstb (-lstb, HEADLAB_STB_SHARED defined); without
// that library it is compiled here, static so that it cannot clash with anything.
#ifndef HEADLAB_STB_SHARED
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#endif
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

namespace fs = std::filesystem;
using namespace headlab::plot;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Image {
  int width = 0, height = 0;
  std::vector<Rgb> px;  // row-major
  Rgb at(int x, int y) const { return px[static_cast<size_t>(y) * width + x]; }
  size_t count(Rgb c) const { return static_cast<size_t>(std::count(px.begin(), px.end(), c)); }
  size_t distinct() const {
    std::set<uint32_t> s;
    for (Rgb c : px) s.insert(c.r << 16 | c.g << 8 | c.b);
    return s.size();
  }
  size_t not_background() const { return px.size() - count(background_color()); }
};

Image load(const fs::path& path) {
  int w = 0, h = 0, n = 0;
  unsigned char* data = stbi_load(path.c_str(), &w, &h, &n, 3);
  if (!data) {
    ADD_FAILURE() << "cannot decode " << path << ": " << stbi_failure_reason();
    return {};
  }
  Image img{w, h, {}};
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i)
    img.px.push_back({data[3 * i], data[3 * i + 1], data[3 * i + 2]});
  stbi_image_free(data);
  return img;
}

// The largest axis-aligned square of one colour found by scanning rows: a heatmap cell is one.
int largest_square(const Image& img, Rgb c) {
  std::vector<int> up(img.width, 0), prev(img.width, 0), cur(img.width, 0);
  int best = 0;
  for (int y = 0; y < img.height; ++y) {
    for (int x = 0; x < img.width; ++x) {
      if (img.at(x, y) != c) {
        cur[x] = 0;
        continue;
      }
      cur[x] = (x > 0 && y > 0) ? 1 + std::min({prev[x], prev[x - 1], cur[x - 1]}) : 1;
      best = std::max(best, cur[x]);
    }
    std::swap(prev, cur);
  }
  return best;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const headlab::Error& e) {
    return e.what();
  }
  return "<no error>";
}

class PlotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("headlab_plot_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

LineChart timing_chart() {
  LineChart c;
  c.title = "forward time";
  c.x_label = "heads";
  c.y_label = "ms";
  Series w{"wrapper", {}, {}}, f{"fused", {}, {}};
  for (int h : {1, 2, 4, 8, 16}) {
    w.x.push_back(h);
    w.y.push_back(1.0 + 0.8 * h);
    f.x.push_back(h);
    f.y.push_back(0.9 + 0.05 * h);
  }
  c.series = {w, f};
  return c;
}

Heatmap ramp_heatmap(int64_t rows, int64_t cols) {
  Heatmap m;
  m.title = "head importance";
  m.x_label = "head";
  m.y_label = "layer";
  m.rows = rows;
  m.cols = cols;
  for (int64_t i = 0; i < rows * cols; ++i) m.values.push_back(static_cast<double>(i));
  return m;
}

// ---------------------------------------------------------------------------------------------

TEST(PlotColors, ViridisEndsAndIsPerceptuallyOrdered) {
  EXPECT_EQ(viridis(0.0), (Rgb{68, 1, 84}));             // matplotlib's first entry
  EXPECT_EQ(viridis(1.0), (Rgb{253, 231, 37}));          // and last
  EXPECT_EQ(viridis(128 / 255.0), (Rgb{33, 145, 140}));  // entry 128 (0.128, 0.567, 0.551)
  EXPECT_EQ(viridis(-3.0), viridis(0.0));
  EXPECT_EQ(viridis(7.0), viridis(1.0));
  EXPECT_EQ(viridis(kNaN), nan_color());
  // Viridis' lightness rises monotonically: what makes it readable in grey print too.
  double last = -1;
  for (int i = 0; i <= 64; ++i) {
    const Rgb c = viridis(i / 64.0);
    const double lum = 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b;
    EXPECT_GT(lum, last) << "at t = " << i / 64.0;
    last = lum;
  }
}

TEST(PlotColors, SeriesColorsAreDistinctAndCycle) {
  std::set<uint32_t> seen;
  for (size_t i = 0; i < 10; ++i) {
    const Rgb c = series_color(i);
    seen.insert(c.r << 16 | c.g << 8 | c.b);
    EXPECT_NE(c, background_color());
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(series_color(10), series_color(0));
}

// ---------------------------------------------------------------------------------------------
// Line charts

TEST_F(PlotTest, LineChartHasRequestedSizeAndDrawsEachSeries) {
  LineChart c = timing_chart();
  c.width = 640;
  c.height = 400;
  save_line_chart(c, path("lines.png"));
  const Image img = load(path("lines.png"));
  ASSERT_EQ(img.width, 640);
  ASSERT_EQ(img.height, 400);
  EXPECT_GE(img.distinct(), 5u);  // page, ink, grid, two series (no anti-aliasing: few colours)
  EXPECT_GT(img.not_background(), img.px.size() / 50);  // not a blank page
  EXPECT_GT(img.count(series_color(0)), 200u);          // a 2 px line and markers
  EXPECT_GT(img.count(series_color(1)), 200u);
  EXPECT_EQ(img.count(series_color(2)), 0u);  // no third series, no third colour
  // The plot area's middle band is not background-only: data and grid are drawn there.
  size_t inside = 0;
  for (int y = 100; y < 300; ++y)
    for (int x = 150; x < 550; ++x) inside += img.at(x, y) != background_color();
  EXPECT_GT(inside, 500u);
}

TEST_F(PlotTest, LineChartDefaultSizeAndLogAxes) {
  LineChart c = timing_chart();
  c.log_y = true;
  save_line_chart(c, path("log_y.png"));
  const Image a = load(path("log_y.png"));
  EXPECT_EQ(a.width, 800);
  EXPECT_EQ(a.height, 500);
  EXPECT_GT(a.count(series_color(0)), 200u);
  c.log_x = true;
  save_line_chart(c, path("log_xy.png"));
  const Image b = load(path("log_xy.png"));
  EXPECT_GT(b.count(series_color(1)), 200u);
  EXPECT_NE(a.px, b.px);  // the x axis changed
}

TEST_F(PlotTest, LegendIsDrawnOnlyForNamedSeries) {
  LineChart c = timing_chart();
  save_line_chart(c, path("named.png"));
  for (auto& s : c.series) s.name.clear();
  save_line_chart(c, path("unnamed.png"));
  const Image named = load(path("named.png")), unnamed = load(path("unnamed.png"));
  // The legend box is drawn with its own grey frame colour; no legend, no frame.
  const Rgb legend_frame{170, 170, 170};
  EXPECT_GT(named.count(legend_frame), 50u);
  EXPECT_EQ(unnamed.count(legend_frame), 0u);
}

// x of the plot frame's right edge: the right-most column holding a long run of axis ink.
int frame_right(const Image& img) {
  const Rgb ink{34, 34, 34};  // plot.cpp draws axes and text in this dark grey
  for (int x = img.width - 1; x >= 0; --x) {
    int run = 0;
    for (int y = 0; y < img.height; ++y) {
      run = img.at(x, y) == ink ? run + 1 : 0;
      if (run >= img.height / 2) return x;
    }
  }
  return -1;
}

TEST_F(PlotTest, LegendMovesOutsideWhenDataFillTheCorners) {
  // Two series leave the top-left corner free: the legend goes there, the plot keeps its width.
  save_line_chart(timing_chart(), path("roomy.png"));
  const Image roomy = load(path("roomy.png"));
  EXPECT_GE(frame_right(roomy), roomy.width - 30);
  // Twelve wiggly series leave no free spot: the legend must not hide data, so the plot shrinks
  // and the legend is drawn right of it.
  LineChart c;
  for (int k = 0; k < 12; ++k) {
    Series s{"series " + std::to_string(k), {}, {}};
    for (int i = 0; i < 40; ++i) {
      s.x.push_back(i);
      s.y.push_back(std::sin(i / 3.0 + k) * (k + 1));
    }
    c.series.push_back(s);
  }
  save_line_chart(c, path("crowded.png"));
  const Image img = load(path("crowded.png"));
  for (size_t k = 0; k < 10; ++k) EXPECT_GT(img.count(series_color(k)), 100u) << k;
  const int right = frame_right(img);
  EXPECT_LT(right, img.width - 80);
  size_t legend_ink = 0;  // legend text and swatches right of the frame
  for (int y = 0; y < img.height; ++y)
    for (int x = right + 2; x < img.width; ++x) legend_ink += img.at(x, y) != background_color();
  EXPECT_GT(legend_ink, 300u);
}

TEST_F(PlotTest, LineChartSkipsNonFinitePointsAndSurvivesOddInput) {
  LineChart c = timing_chart();
  c.series[0].y[2] = kNaN;
  c.series[1].x[0] = std::numeric_limits<double>::infinity();
  ASSERT_NO_THROW(save_line_chart(c, path("nan.png")));
  EXPECT_GT(load(path("nan.png")).count(series_color(0)), 100u);

  LineChart one;  // one point: a marker in a widened range
  one.series = {{"only", {3.0}, {7.0}}};
  ASSERT_NO_THROW(save_line_chart(one, path("one.png")));
  EXPECT_GT(load(path("one.png")).count(series_color(0)), 20u);

  LineChart flat;  // all-equal values, negative x, a series without a name
  flat.series = {{"flat", {-3, -2, -1}, {5, 5, 5}}, {"", {-3, -1}, {5, 5}}};
  ASSERT_NO_THROW(save_line_chart(flat, path("flat.png")));

  LineChart odd;  // huge and tiny magnitudes, UTF-8 and control characters in text
  odd.title = "caf\xc3\xa9\tloss\n";
  odd.series = {{"\x01weird", {1e-9, 2e-9, 3e-9}, {1e12, -1e12, 5e11}}};
  ASSERT_NO_THROW(save_line_chart(odd, path("odd.png")));

  LineChart tiny = timing_chart();  // the smallest size allowed still lays out
  tiny.width = 200;
  tiny.height = 200;
  tiny.title = "a long title that cannot possibly fit into two hundred pixels";
  ASSERT_NO_THROW(save_line_chart(tiny, path("tiny.png")));
  EXPECT_EQ(load(path("tiny.png")).width, 200);
}

TEST_F(PlotTest, LineChartErrorsNameTheProblem) {
  const std::string out = path("x.png");
  LineChart c;
  EXPECT_NE(error_of([&] { save_line_chart(c, out); }).find("save_line_chart: chart has no series"),
            std::string::npos);

  c = timing_chart();
  c.series[1].y.pop_back();
  EXPECT_NE(error_of([&] {
              save_line_chart(c, out);
            }).find("series 'fused' has 5 x values but 4 y values"),
            std::string::npos);

  c = timing_chart();
  c.series[0].x.clear();
  c.series[0].y.clear();
  EXPECT_NE(error_of([&] { save_line_chart(c, out); }).find("series 'wrapper' has no points"),
            std::string::npos);

  c = timing_chart();
  c.log_y = true;
  c.series[1].y[3] = 0;
  EXPECT_NE(error_of([&] {
              save_line_chart(c, out);
            }).find("log_y needs y > 0, but series 'fused' has y[3] = 0"),
            std::string::npos);

  c = timing_chart();
  c.log_x = true;
  c.series[0].x[0] = -1;
  EXPECT_NE(error_of([&] { save_line_chart(c, out); }).find("log_x needs x > 0"),
            std::string::npos);

  c = timing_chart();
  for (auto& s : c.series) std::fill(s.y.begin(), s.y.end(), kNaN);
  EXPECT_NE(error_of([&] { save_line_chart(c, out); }).find("no finite (x, y) point"),
            std::string::npos);

  c = timing_chart();
  c.width = 50;
  EXPECT_NE(error_of([&] { save_line_chart(c, out); }).find("save_line_chart: size 50 x 500"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(out));  // nothing written on error
}

TEST_F(PlotTest, UnwritablePathIsReportedWithThePath) {
  const std::string bad = (dir_ / "no_such_dir" / "x.png").string();
  const std::string msg = error_of([&] { save_line_chart(timing_chart(), bad); });
  EXPECT_EQ(msg.rfind("plot: cannot write '" + bad + "': ", 0), 0u) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  // A directory in the way is refused too and left alone.
  const std::string msg2 = error_of([&] { save_heatmap(ramp_heatmap(2, 2), dir_.string()); });
  EXPECT_EQ(msg2.rfind("plot: cannot write '", 0), 0u) << msg2;
  EXPECT_TRUE(fs::is_directory(dir_));
}

TEST_F(PlotTest, ExistingFileIsReplaced) {
  { std::ofstream(path("old.png")) << "not a png"; }
  save_line_chart(timing_chart(), path("old.png"));
  EXPECT_EQ(load(path("old.png")).width, 800);
}

// ---------------------------------------------------------------------------------------------
// Heatmaps

TEST_F(PlotTest, HeatmapCellsUseTheColourMapEnds) {
  Heatmap m = ramp_heatmap(3, 4);  // values 0..11: cell (0,0) is the minimum, (2,3) the maximum
  m.colorbar_label = "importance";
  save_heatmap(m, path("heat.png"));
  const Image img = load(path("heat.png"));
  ASSERT_GT(img.width, 100);
  ASSERT_GT(img.height, 100);
  EXPECT_LE(img.width, 1000);
  EXPECT_GT(img.distinct(), 12u);
  // Whole cells (squares well over 20 px) in the map's end colours; the colour bar alone is
  // only 16 px wide, so these can only be the min and max cells.
  EXPECT_GE(largest_square(img, viridis(0.0)), 20);
  EXPECT_GE(largest_square(img, viridis(1.0)), 20);
  EXPECT_EQ(img.count(nan_color()), 0u);
  // The min cell is left of and above the max cell (row-major, row 0 on top).
  auto centroid = [&](Rgb c) {
    double sx = 0, sy = 0, n = 0;
    for (int y = 0; y < img.height; ++y)
      for (int x = 0; x < img.width; ++x)
        if (img.at(x, y) == c) sx += x, sy += y, n += 1;
    return std::pair{sx / n, sy / n};
  };
  // Colour-bar pixels pull the centroids towards the bar a little; cells dominate.
  const auto [x0, y0] = centroid(viridis(0.0));
  const auto [x1, y1] = centroid(viridis(1.0));
  EXPECT_LT(x0, x1);
  EXPECT_LT(y0, y1);
}

TEST_F(PlotTest, HeatmapNaNCellsAreGreyAndRangeClamps) {
  Heatmap m = ramp_heatmap(2, 3);
  m.values[4] = kNaN;
  m.vmin = 1.0;  // value 0 is below: drawn in the bottom colour
  m.vmax = 3.0;  // values 3 and 5 at or above: top colour
  save_heatmap(m, path("nan.png"));
  const Image img = load(path("nan.png"));
  EXPECT_GE(largest_square(img, nan_color()), 20);
  EXPECT_GE(largest_square(img, viridis(0.0)), 20);
  EXPECT_GE(largest_square(img, viridis(1.0)), 20);
  EXPECT_GE(largest_square(img, viridis(0.5)), 20);  // value 2 is mid-range
}

TEST_F(PlotTest, HeatmapAnnotationsWriteTextInCells) {
  Heatmap m = ramp_heatmap(4, 6);
  save_heatmap(m, path("plain.png"));
  m.annotate = true;
  save_heatmap(m, path("annotated.png"));
  const Image plain = load(path("plain.png")), annotated = load(path("annotated.png"));
  ASSERT_EQ(plain.width, annotated.width);
  // Text is white on dark cells and black on light ones: dark cells gain white pixels.
  const Rgb white{255, 255, 255};
  size_t white_in_cells_plain = 0, white_in_cells_annot = 0;
  auto count_white_near_dark = [&](const Image& img) {
    size_t n = 0;
    for (int y = 1; y + 1 < img.height; ++y)
      for (int x = 1; x + 1 < img.width; ++x)
        if (img.at(x, y) == white && img.at(x - 1, y) == viridis(0.0)) ++n;
    return n;
  };
  white_in_cells_plain = count_white_near_dark(plain);
  white_in_cells_annot = count_white_near_dark(annotated);
  EXPECT_EQ(white_in_cells_plain, 0u);
  EXPECT_GT(white_in_cells_annot, 3u);
}

TEST_F(PlotTest, HeatmapOddInputDoesNotCrash) {
  Heatmap eq;  // all equal: mid colour, widened range
  eq.rows = 1;
  eq.cols = 3;
  eq.values = {2, 2, 2};
  save_heatmap(eq, path("equal.png"));
  EXPECT_GE(largest_square(load(path("equal.png")), viridis(0.5)), 20);

  Heatmap nan;  // nothing finite: all grey
  nan.rows = 2;
  nan.cols = 2;
  nan.values.assign(4, kNaN);
  save_heatmap(nan, path("allnan.png"));
  EXPECT_GE(largest_square(load(path("allnan.png")), nan_color()), 40);

  Heatmap wide = ramp_heatmap(2, 300);  // many columns: small cells, thinned labels
  wide.row_labels = {"first layer", "caf\xc3\xa9"};
  save_heatmap(wide, path("wide.png"));
  EXPECT_LE(load(path("wide.png")).width, 1200);

  Heatmap only_vmin = ramp_heatmap(1, 2);  // one bound above all data
  only_vmin.vmin = 100.0;
  EXPECT_NO_THROW(save_heatmap(only_vmin, path("vmin.png")));
}

TEST_F(PlotTest, HeatmapErrorsNameTheProblem) {
  const std::string out = path("x.png");
  Heatmap m = ramp_heatmap(3, 4);
  m.values.pop_back();
  EXPECT_NE(error_of([&] {
              save_heatmap(m, out);
            }).find("save_heatmap: 11 values for a 3 x 4 heatmap (expected 12)"),
            std::string::npos);
  m = ramp_heatmap(3, 4);
  m.row_labels = {"a", "b"};
  EXPECT_NE(error_of([&] { save_heatmap(m, out); }).find("2 row labels for 3 rows"),
            std::string::npos);
  m = ramp_heatmap(3, 4);
  m.col_labels = {"a"};
  EXPECT_NE(error_of([&] { save_heatmap(m, out); }).find("1 column labels for 4 columns"),
            std::string::npos);
  m = ramp_heatmap(3, 4);
  m.vmin = 2;
  m.vmax = 2;
  EXPECT_NE(error_of([&] { save_heatmap(m, out); }).find("vmin (2) must be less than vmax (2)"),
            std::string::npos);
  m = ramp_heatmap(3, 4);
  m.vmax = kNaN;
  EXPECT_NE(error_of([&] { save_heatmap(m, out); }).find("vmax must be finite"), std::string::npos);
  Heatmap empty;
  EXPECT_NE(error_of([&] {
              save_heatmap(empty, out);
            }).find("rows and cols must be in 1..8000, got 0 x 0"),
            std::string::npos);
  Heatmap huge = ramp_heatmap(1, 7999);  // fits the limits per dimension but not as a picture
  EXPECT_NE(error_of([&] { save_heatmap(huge, out); }).find("save_heatmap: the picture would be"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(out));
}

// ---------------------------------------------------------------------------------------------
// Grids of heatmaps

HeatmapGrid attention_grid(int64_t layers, int64_t heads, int64_t tokens) {
  HeatmapGrid g;
  g.title = "attention weights";
  g.x_label = "key";
  g.y_label = "query";
  g.colorbar_label = "weight";
  g.grid_rows = layers;
  g.grid_cols = heads;
  std::vector<std::string> toks;
  for (int64_t t = 0; t < tokens; ++t)
    toks.push_back(std::string(1, static_cast<char>('a' + t % 26)) + "x");
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t h = 0; h < heads; ++h) {
      Heatmap p;
      p.title = "layer " + std::to_string(l) + " head " + std::to_string(h);
      p.rows = p.cols = tokens;
      p.row_labels = p.col_labels = toks;
      for (int64_t q = 0; q < tokens; ++q)  // causal: uniform over keys 0..q
        for (int64_t k = 0; k < tokens; ++k) p.values.push_back(k <= q ? 1.0 / (q + 1) : 0.0);
      g.panels.push_back(p);
    }
  return g;
}

TEST_F(PlotTest, GridDrawsEveryPanelWithTheSharedRange) {
  HeatmapGrid g = attention_grid(2, 3, 8);
  save_heatmap_grid(g, path("grid.png"));
  const Image img = load(path("grid.png"));
  ASSERT_GT(img.width, 300);
  EXPECT_GT(img.distinct(), 20u);
  // Six panels each hold a (0, 0) cell of weight 1 (top colour) and zero cells (bottom colour):
  // count the separate top-colour squares of at least 8 px.
  EXPECT_GE(largest_square(img, viridis(1.0)), 8);
  EXPECT_GE(largest_square(img, viridis(0.0)), 8);
  size_t top_cells = 0;
  for (int y = 1; y < img.height; ++y)
    for (int x = 1; x < img.width; ++x)
      if (img.at(x, y) == viridis(1.0) && img.at(x - 1, y) != viridis(1.0) &&
          img.at(x, y - 1) != viridis(1.0) && x + 7 < img.width && y + 7 < img.height &&
          img.at(x + 7, y) == viridis(1.0) && img.at(x + 7, y + 7) == viridis(1.0))
        ++top_cells;         // top-left corners of 8 x 8 top-colour blocks
  EXPECT_EQ(top_cells, 6u);  // the colour bar's top-colour rows are too few to count
}

TEST_F(PlotTest, LargeGridKeepsASaneSize) {
  HeatmapGrid g = attention_grid(4, 8, 32);
  save_heatmap_grid(g, path("big.png"));
  const Image img = load(path("big.png"));
  EXPECT_LE(img.width, 4000);
  EXPECT_LE(img.height, 4000);
  EXPECT_GE(img.width, 32 * 8 * 4);  // cells of at least 4 px, or tokens could not be seen
  EXPECT_GE(largest_square(img, viridis(1.0)), 4);
}

TEST_F(PlotTest, SharedTokenLabelsAreWrittenOnce) {
  // Same tokens everywhere: labels only on the left column and bottom row, so the picture is
  // smaller than when every panel has tokens of its own and must label them.
  HeatmapGrid shared = attention_grid(2, 2, 6);
  HeatmapGrid own = shared;  // the same label strings, in a different order per panel
  for (size_t i = 1; i < own.panels.size(); ++i) {
    auto& p = own.panels[i];
    std::rotate(p.row_labels.begin(), p.row_labels.begin() + i, p.row_labels.end());
    std::rotate(p.col_labels.begin(), p.col_labels.begin() + i, p.col_labels.end());
  }
  save_heatmap_grid(shared, path("shared.png"));
  save_heatmap_grid(own, path("own.png"));
  const Image a = load(path("shared.png")), b = load(path("own.png"));
  EXPECT_LT(a.width, b.width);
  EXPECT_LT(a.height, b.height);
}

TEST_F(PlotTest, GridMayLeaveTheLastRowShort) {
  HeatmapGrid g = attention_grid(2, 2, 4);
  g.panels.pop_back();
  g.panels[1].values[0] = kNaN;
  EXPECT_NO_THROW(save_heatmap_grid(g, path("short.png")));
  EXPECT_GE(largest_square(load(path("short.png")), nan_color()), 8);
}

TEST_F(PlotTest, GridErrorsNameThePanel) {
  const std::string out = path("x.png");
  HeatmapGrid g = attention_grid(2, 2, 4);
  g.panels[2].values.resize(3);
  EXPECT_NE(error_of([&] {
              save_heatmap_grid(g, out);
            }).find("save_heatmap_grid: panel 2 ('layer 1 head 0'): 3 values for a 4 x 4 heatmap"),
            std::string::npos);
  g = attention_grid(2, 2, 4);
  g.grid_rows = 1;
  EXPECT_NE(error_of([&] { save_heatmap_grid(g, out); }).find("4 panels do not fit a 1 x 2 grid"),
            std::string::npos);
  g = attention_grid(1, 1, 4);
  g.vmin = 1;
  g.vmax = 0;
  EXPECT_NE(
      error_of([&] { save_heatmap_grid(g, out); }).find("need finite vmin < vmax, got [1, 0]"),
      std::string::npos);
  g.panels.clear();
  g.vmin = 0;
  g.vmax = 1;
  EXPECT_NE(error_of([&] { save_heatmap_grid(g, out); }).find("save_heatmap_grid: no panels"),
            std::string::npos);
  g = attention_grid(1, 1, 4);
  g.grid_cols = 0;
  EXPECT_NE(
      error_of([&] { save_heatmap_grid(g, out); }).find("grid must be 1..256 x 1..256 panels"),
      std::string::npos);
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
