// headlab::plot: line charts, heatmaps and grids of heatmaps written as PNG files, for
// `headlab compare` (timings), `ablate` (pruning curves, head importance) and `attention` weights.
// Pure CPU rasterisation with Debian's stb (link -lstb); text is ASCII, other bytes show as '?'.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace headlab::plot {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

// One named line of a LineChart. Points are joined in the order given; a non-finite x or y
// (NaN, inf) is skipped and breaks the line there, like matplotlib.
struct Series {
  std::string name;  // shown in the legend; a chart whose series are all unnamed has no legend
  std::vector<double> x, y;
};

// log_x / log_y need every finite x / y > 0: a log axis cannot show 0 or negative values, and
// silently dropping points would misreport a timing, so save_line_chart throws instead.
// The legend sits in a corner of the plot that covers no data, or right of the plot if none is
// free. Text and strokes grow with the size: 2x from 1000 x 1000 pixels, 3x from 1500 x 1500.
struct LineChart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool log_x = false, log_y = false;  // log_x suits token counts that double: 64, 128, ..., 4096
  int width = 800, height = 500;      // pixels, each within [200, 8000]
};

// rows x cols cells (e.g. rows = layers, cols = heads), values row-major, NaN cells drawn grey.
// Empty label vectors mean "0, 1, 2, ...". Colour range: vmin/vmax when given, else the finite
// data range; values outside it get the end colours. Cell size is chosen automatically.
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

// Each writes one RGB PNG, replacing an existing file; throws headlab::Error on bad input or when
// the file cannot be written ("plot: cannot write 'dir/x.png': No such file or directory ...").
void save_line_chart(const LineChart& chart, const std::string& png_path);
void save_heatmap(const Heatmap& map, const std::string& png_path);
void save_heatmap_grid(const HeatmapGrid& grid, const std::string& png_path);

// The colours the pictures use, for tests and for callers who draw matching legends elsewhere.
Rgb series_color(size_t i);  // tab10 palette, cycling
Rgb viridis(double t);       // t in [0, 1], clamped; NaN gives nan_color()
Rgb nan_color();             // grey for NaN heatmap cells
Rgb background_color();      // white page

}  // namespace headlab::plot
