// headlab::plot: line charts, heatmaps and grids of heatmaps for `headlab compare` (timings),
// `ablate` (pruning curves, head importance) and `attention` (weights), drawn by PLplot's cairo
// devices. The file's extension picks the format: .png, .svg or .pdf.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace headlab::plot {

// One named line of a LineChart, drawn with markers where its points are not too dense. Points
// are joined in the order given; a non-finite x or y (NaN, inf) is skipped and breaks the line
// there, like matplotlib. A series with no finite point draws nothing but keeps its legend entry.
struct Series {
  std::string name;  // shown in the legend; a chart whose series are all unnamed has no legend
  std::vector<double> x, y;
};

// log_x / log_y need every finite x / y > 0: a log axis cannot show 0 or negative values, and
// silently dropping points would misreport a timing, so save_line_chart throws instead.
// A log axis that would show fewer than two decades is widened to whole decades, so that it has
// labels. A chart with no series, or with no finite point at all, is drawn as empty axes over
// [0, 1] ([1, 10] on a log axis), so that a caller's report still has its picture.
// The legend (named series only) sits right of the plot, where it covers no data. Text and strokes
// grow with the size (800 x 500 is the unit).
// A vertical dashed line across a chart at x, its name written at the top (an event: "phase change").
struct XMark {
  double x = 0;
  std::string name;
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  std::vector<XMark> x_marks;         // each widens the x range to show it
  bool log_x = false, log_y = false;  // log_x suits token counts that double: 64, 128, ..., 4096
  int width = 800, height = 500;      // pixels, each within [200, 8000]
};

// rows x cols cells (e.g. rows = layers, cols = heads), values row-major, NaN cells drawn grey.
// Empty label vectors mean "0, 1, 2, ...". Colour range (viridis): vmin/vmax when given, else the
// finite data range; values outside it get the end colours. Cell size, and so the picture's size,
// is chosen automatically.
struct Heatmap {
  std::string title, x_label, y_label;
  int64_t rows = 0, cols = 0;
  std::vector<double> values;  // (rows, cols)
  std::vector<std::string> row_labels, col_labels;
  std::optional<double> vmin, vmax;
  bool annotate = false;  // write each value in its cell when the cells are big enough
  std::string colorbar_label;
};

// grid_rows x grid_cols panels filled row by row (panels.size() may leave the last row short).
// Each panel uses its own title, labels, values and annotate flag; the colour range and colour bar
// are shared, so a panel's vmin/vmax/colorbar_label are ignored. When every panel has the same
// row (column) labels they are written only on the left column (bottom row) of panels.
struct HeatmapGrid {
  std::string title, x_label, y_label, colorbar_label;
  int64_t grid_rows = 0, grid_cols = 0;
  std::vector<Heatmap> panels;
  double vmin = 0, vmax = 1;
};

// Each writes one picture to `path`, replacing an existing file. Sizes are in pixels: a PNG has
// exactly that many; SVG and PDF pages get 0.72 pt per pixel (100 pixels per inch, matplotlib's
// default dpi), so 800 x 500 becomes 576 x 360 pt. Labels may hold any bytes (tokens of a text):
// printable ASCII is drawn literally ('#' too), every other byte is spelled out in ASCII (\n, \t,
// \xC3\xA9). Thread-safe (PLplot is not, so calls are serialised); never prints.
// Throws headlab::Error on bad input, on an extension other than .png/.svg/.pdf, and when the
// file cannot be written ("save_heatmap: cannot write 'dir/x.png': No such file or directory ...").
void save_line_chart(const LineChart& chart, const std::string& path);
// Charts side by side in one picture, each at its own size (the picture is as tall as the tallest).
void save_line_charts(const std::vector<LineChart>& charts, const std::string& path);
void save_heatmap(const Heatmap& map, const std::string& path);
void save_heatmap_grid(const HeatmapGrid& grid, const std::string& path);

}  // namespace headlab::plot
