// headlab::plot over PLplot's cairo devices (pngcairo, svgcairo, pdfcairo): layout is computed here in
// pixels from the top-left corner, PLplot draws. PLplot is C with process-wide state, so a mutex
// serialises the calls, each call owns a stream, and PLplot's error hooks throw instead of exiting.
#include "plot/plot.h"

#include <plplot/plplot.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <utility>

#include "base/error.h"

namespace headlab::plot {
namespace {
constexpr int kMinSide = 200, kMaxSide = 8000;  // pixels; the bound keeps a bad size from eating memory

// cmap0: page, ink, grid lines, NaN grey, legend frame, then matplotlib's tab10 for the series (hues
// that stay apart for colour-blind readers too).
enum : PLINT { kPage, kInk, kGridInk, kNanGrey, kFrame, kTab10, kColours = kTab10 + 10 };
constexpr unsigned kPalette[kColours] = {0xffffff, 0x222222, 0xdedede, 0xc0c0c0, 0xcccccc, 0x1f77b4, 0xff7f0e, 0x2ca02c,
                                         0xd62728, 0x9467bd, 0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf};

// matplotlib's viridis (van der Walt & Smith), every 8th of its 256 entries plus the last; cmap1
// interpolates linearly between them, within about one 8-bit step of the full table. Below 0.6 it
// is darker than mid-grey, so cell values there are written in white.
constexpr unsigned kViridis[33] = {
    0x440154, 0x470d60, 0x48186a, 0x482374, 0x472d7b, 0x453781, 0x424086, 0x3e4989, 0x3b528b, 0x375b8d, 0x33638d,
    0x2f6b8e, 0x2c728e, 0x297a8e, 0x26828e, 0x23898e, 0x21918c, 0x1f988b, 0x1fa088, 0x22a785, 0x28ae80, 0x32b67a,
    0x3fbc73, 0x4ec36b, 0x5ec962, 0x70cf57, 0x84d44b, 0x98d83e, 0xaddc30, 0xc2df23, 0xd8e219, 0xece51b, 0xfde725};
int channel(unsigned rgb, int c) { return static_cast<int>(rgb >> (16 - 8 * c) & 0xff); }  // c: 0 red, 1 green, 2 blue

// PLplot 5.15 exports no way to measure a string, and margins are needed before drawing: widths are
// estimated from DejaVu Sans (fontconfig's usual "sans"), in ems, erring on the wide side.
double em_of(std::string_view ascii) {
  double em = 0;
  for (char c : ascii)  // narrow, wide, capital, other
    em += std::strchr(" !'(),.:;I[]fijlrt|", c) ? 0.36
          : std::strchr("%@MWmw", c)            ? 0.95
          : c >= 'A' && c <= 'Z'                ? 0.76
                                                : 0.65;
  return em;
}

struct Label {
  std::string pl;  // for PLplot
  double em = 0;   // estimated width in ems
};

// Any bytes (a token of a text, say) as a string PLplot draws literally: '#', its escape character,
// is doubled; other bytes than printable ASCII become \n, \t, \r or \xHH, so that no byte can reach
// PLplot as malformed UTF-8 (which it refuses) or pango as a control character. Beyond max_chars
// characters the text is cut and ends in "...".
Label label(std::string_view s, size_t max_chars = 120) {
  Label out;
  for (size_t i = 0, chars = 0; i < s.size(); ++chars) {
    const char b = s[i];
    char hex[8];
    std::snprintf(hex, sizeof(hex), "\\x%02X", static_cast<unsigned char>(b));
    const std::string ascii = chars == max_chars   ? "..."
                              : b >= 32 && b < 127 ? std::string(1, b)
                              : b == '\n'          ? "\\n"
                              : b == '\t'          ? "\\t"
                              : b == '\r'          ? "\\r"
                                                   : hex;
    i = chars == max_chars ? s.size() : i + 1;
    for (char c : ascii) out.pl += c == '#' ? "##" : std::string(1, c);
    out.em += em_of(ascii);
  }
  return out;
}

Label fit(std::string_view s, double font_px, double room_px) {  // cut with "..." to fit the room
  Label l = label(s);
  for (size_t n = 100; l.em * font_px > room_px && n > 3; n = n * 4 / 5) l = label(s, n);
  return l;
}

// A value with the digits its step needs (0.1 steps give "0.3", not "0.30000001"); when the values
// of its axis (up to `scale` in magnitude) are huge or tiny, with a short exponent ("1.5e-5").
std::string format_tick(double v, double step, double scale = 0) {
  if (std::abs(v) < step * 1e-6) v = 0;  // no "-0" or 1e-17 from rounding
  const double mag = std::max({std::abs(v), step, scale});
  const int lead = static_cast<int>(std::floor(std::log10(mag)));
  const int last = static_cast<int>(std::floor(std::log10(step) + 1e-9));
  char buf[48];
  if (mag < 1e5 && step >= 1e-4) return std::snprintf(buf, sizeof(buf), "%.*f", std::max(0, -last), v), buf;
  if (v == 0) return "0";
  std::snprintf(buf, sizeof(buf), "%.*e", std::clamp(lead - last, 0, 6), v);
  const std::string s = buf;
  const size_t e = s.find('e'), d = s.find_first_not_of("+-0", e + 1);  // "1.5e-05" -> "1.5e-5"
  return s.substr(0, e + 1) + (s[e + 1] == '-' ? "-" : "") + (d == std::string::npos ? "0" : s.substr(d));
}

// Cell values: two significant digits for the largest magnitude, the same decimals for all cells.
std::string cell_text(double v, double maxabs) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
  return format_tick(v, maxabs > 0 ? std::pow(10.0, std::floor(std::log10(maxabs)) - 1) : 1, maxabs);
}

std::mutex g_mutex;         // PLplot and its cairo driver keep process-wide state
const char* g_fn = "plot";  // the save_* call under way, for PLplot's error messages

// PLplot's errors print and call exit(); these hooks throw instead. The exception unwinds through
// PLplot's C frames, which have unwind tables (the x86-64 ABI default).
int on_plexit(const char* msg) { HL_FAIL(g_fn, ": PLplot failed: ", msg); }
void on_plabort(const char* msg) { HL_FAIL(g_fn, ": PLplot refused a call: ", msg); }

// One picture: holds the lock and a PLplot stream drawing into memory, and the file, opened here and
// written when the picture is finished, so that a failure (a full disk included) names the path and
// the reason; a picture not finished is removed. Coordinates are pixels from the
// top-left corner; SVG and PDF pages get 0.72 pt per pixel.
class Page {
 public:
  Page(const char* fn, const std::string& path, double w, double h) : fn_(fn), path_(path), w_(w), h_(h) {
    const std::string ext = std::filesystem::path(path).extension().string();
    const char* dev = ext == ".png" ? "pngcairo" : ext == ".svg" ? "svgcairo" : ext == ".pdf" ? "pdfcairo" : nullptr;
    HL_CHECK(dev, fn, ": cannot tell the format of '", path, "' from its extension: expected .png, .svg or .pdf");
    HL_CHECK(w >= kMinSide && h >= kMinSide && w <= kMaxSide && h <= kMaxSide, fn, ": the picture would be ",
             std::lround(w), " x ", std::lround(h), " pixels, outside ", kMinSide, "..", kMaxSide);
    u_ = ext == ".png" ? 1 : 0.72;
    g_fn = fn;
    plsexit(on_plexit);
    plsabort(on_plabort);
    // The file is opened now, so that a path that cannot be written fails before any drawing; PLplot
    // writes into memory (its drivers ignore write errors), and finish() writes the bytes, checked.
    out_ = std::fopen(path.c_str(), "wb");
    if (!out_) HL_FAIL(fn, ": cannot write '", path, "': ", std::strerror(errno), " (does the directory exist?)");
    file_ = open_memstream(&buf_, &len_);
    if (!file_) {
      const int err = errno;
      release();
      HL_FAIL(fn, ": cannot draw '", path, "' into memory: ", std::strerror(err));
    }
    try {
      plmkstrm(&stream_);
      HL_CHECK(stream_ >= 0, fn, ": PLplot has no free stream");
      plsdev(dev);
      plsfile(file_);
      plspage(0, 0, static_cast<PLINT>(std::lround(w * u_)), static_cast<PLINT>(std::lround(h * u_)), 0, 0);
      plscmap0n(kColours);
      for (int i = 0; i < kColours; ++i)
        plscol0(i, channel(kPalette[i], 0), channel(kPalette[i], 1), channel(kPalette[i], 2));
      plinit();
      PLFLT at[33], rgb[3][33];
      for (int i = 0; i < 99; ++i)
        at[i / 3] = std::min(1.0, i / 3 * 8 / 255.0), rgb[i % 3][i / 3] = channel(kViridis[i / 3], i % 3) / 255.0;
      plscmap1n(256);
      plscmap1l(1, 33, at, rgb[0], rgb[1], rgb[2], nullptr);
      pladv(0);
    } catch (...) {
      release();
      throw;
    }
  }
  ~Page() { release(); }
  void finish() {  // PLplot renders the picture when its stream ends; then its bytes go to the file
    end();
    HL_CHECK(buf_ && len_ > 0, fn_, ": cannot write '", path_, "': PLplot produced nothing");
    errno = 0;
    int err = std::fwrite(buf_, 1, len_, out_) == len_ ? 0 : (errno ? errno : EIO);
    if (std::fflush(out_) != 0 && !err) err = errno;
    if (std::fclose(std::exchange(out_, nullptr)) != 0 && !err) err = errno;
    HL_CHECK(!err, fn_, ": cannot write '", path_, "': ", std::strerror(err));
    done_ = true;
  }
  // The pixel rectangle [x0, x1] x [y0, y1] shows world [wx0, wx1] x [wy0 (bottom), wy1].
  void area(double x0, double y0, double x1, double y1, double wx0, double wx1, double wy0, double wy1) {
    plvpor(x0 / w_, x1 / w_, 1 - y1 / h_, 1 - y0 / h_);
    plwind(wx0, wx1, wy0, wy1);
  }
  void pixels() { area(0, 0, w_, h_, 0, w_, h_, 0); }  // decorations: world = pixels, y down, no clipping
  // The cairo driver turns chrht into a pango size in points, which pango renders at 96 dpi.
  void font(double px) { plschr(px * u_ * 0.75 * 25.4 / 72, 1.0); }
  double pen(double px) { return plwidth(px * u_), px * u_; }  // returns the width in PLplot's units
  void ticks(double px) { plsmaj(px * u_ * 25.4 / 72, 1.0), plsmin(0.6 * px * u_ * 25.4 / 72, 1.0); }  // lengths
  // Text centred vertically on y; just: 0 left, 0.5 centre, 1 right; up: reads bottom to top.
  void text(double x, double y, const std::string& s, double just, bool up = false) {
    if (!s.empty()) plptex(x, y, up ? 0 : 1, up ? -1 : 0, just, s.c_str());
  }

 private:
  void end() {  // ends the stream once; PLplot closes the file only if plinit got through
    PLINT level = 0;
    if (stream_ >= 0) plglevel(&level);
    std::FILE* f = std::exchange(file_, nullptr);
    if (std::exchange(stream_, -1) >= 0) plend1();
    if (level == 0 && f) std::fclose(f);
  }
  void release() noexcept {
    try {
      end();
    } catch (...) {  // drawing failed: keep the error already on its way
    }
    if (out_) std::fclose(std::exchange(out_, nullptr));
    std::free(std::exchange(buf_, nullptr));
    if (!done_) std::remove(path_.c_str());
  }
  std::lock_guard<std::mutex> lock_{g_mutex};
  const char* fn_;
  std::string path_;
  double w_, h_, u_ = 1;
  std::FILE* file_ = nullptr;  // PLplot's: a memory stream over buf_ / len_
  std::FILE* out_ = nullptr;   // path_
  char* buf_ = nullptr;
  size_t len_ = 0;
  PLINT stream_ = -1;
  bool done_ = false;
};

// Axis ticks: decades on a log axis (every step-th labelled when crowded), else multiples of a step
// of 1, 2 or 5 times a power of ten, as many as fit. PLplot draws them; the labels are ours
// (plslabelfunc), so that margins fit them.
struct Axis {
  double lo = 0, hi = 1, step = 1, em = 0;  // world coordinates (log10 on a log axis); em: widest label
  bool log = false;
};
std::string tick_text(const Axis& a, double w) {
  if (!a.log) return format_tick(w, a.step, std::max(std::abs(a.lo), std::abs(a.hi)));
  const double d = std::round(w), v = std::pow(10.0, d);
  if (std::fmod(d, a.step) != 0) return "";
  return d >= -3 && d <= 4 ? format_tick(v, v) : "1e" + std::to_string(static_cast<int>(d));
}
void tick_label(PLINT axis, PLFLT w, char* out, PLINT length, PLPointer axes) {  // axes: {x, y}
  const std::string text = tick_text(static_cast<Axis*>(axes)[axis == PL_Y_AXIS], w);
  std::snprintf(out, static_cast<size_t>(length), "%s", text.c_str());
}

void make_ticks(Axis& a, double len, double fs, bool stacked) {  // stacked: labels one above another
  double raw = (a.hi - a.lo) * (stacked ? 4 : 6) * fs / len;     // the step for the spacing wanted, in pixels
  for (int pass = 0; pass < 2; ++pass) {                         // the second makes room for labels wider than that
    const double p = std::pow(10.0, std::floor(std::log10(raw)));
    a.step = a.log ? std::ceil(raw / 2) : raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
    a.em = 0;
    for (double k = std::ceil(a.lo / a.step - 1e-9); k * a.step <= a.hi + 1e-9 * a.step; ++k)
      a.em = std::max(a.em, em_of(tick_text(a, k * a.step)));
    raw = std::max(raw, (a.hi - a.lo) * (stacked ? 0 : a.em + 1.5) * fs / len);
  }
}

void validate_panel(const Heatmap& m, const std::string& who) {
  HL_CHECK(m.rows >= 1 && m.cols >= 1 && m.rows <= kMaxSide && m.cols <= kMaxSide, who,
           ": rows and cols must be in 1..", kMaxSide, ", got ", m.rows, " x ", m.cols);
  HL_CHECK(static_cast<int64_t>(m.values.size()) == m.rows * m.cols, who, ": ", m.values.size(), " values for a ",
           m.rows, " x ", m.cols, " heatmap (expected ", m.rows * m.cols, ")");
  HL_CHECK(m.row_labels.empty() || static_cast<int64_t>(m.row_labels.size()) == m.rows, who, ": ", m.row_labels.size(),
           " row labels for ", m.rows, " rows");
  HL_CHECK(m.col_labels.empty() || static_cast<int64_t>(m.col_labels.size()) == m.cols, who, ": ", m.col_labels.size(),
           " column labels for ", m.cols, " columns");
}
std::vector<Label> tick_names(const std::vector<std::string>& given, int64_t count) {  // empty: 0, 1, 2, ...
  std::vector<Label> out;
  for (int64_t j = 0; j < count; ++j) out.push_back(label(given.empty() ? std::to_string(j) : given[j], 20));
  return out;
}

// Heatmaps: a single one is a 1 x 1 grid with the map's title as the figure's. The matrices side by
// side get budget_w x budget_h pixels, cells at most max_cell.
void draw_grid(const char* fn, const HeatmapGrid& g, const std::string& path, double budget_w, double budget_h,
               double max_cell) {
  const double fs = 11.5, pfs = 13, tfs = 15.5, tick = 3, gap = 4, pad = 12, hgap = 18, vgap = 14;
  const auto n = static_cast<int64_t>(g.panels.size());
  const int64_t gcols = g.grid_cols, grows = (n + gcols - 1) / gcols;
  const Heatmap& first = g.panels[0];
  bool shared_rows = true, shared_cols = true, titled = false, xl = false, yl = false;
  // Cell values are written with the digits the colour range needs (two significant ones).
  double max_r = 1, max_c = 1, row_em = 0, col_em = 0, text_em = 0, scale = std::max(-g.vmin, g.vmax);
  for (int64_t i = 0; i < n; ++i) {
    const Heatmap& p = g.panels[i];
    shared_rows &= p.rows == first.rows && p.row_labels == first.row_labels && p.y_label == first.y_label;
    shared_cols &= p.cols == first.cols && p.col_labels == first.col_labels && p.x_label == first.x_label;
    titled |= !p.title.empty(), xl |= !p.x_label.empty(), yl |= !p.y_label.empty();
    max_r = std::max(max_r, static_cast<double>(p.rows)), max_c = std::max(max_c, static_cast<double>(p.cols));
    for (const Label& l : tick_names(p.row_labels, p.rows)) row_em = std::max(row_em, l.em);
    for (const Label& l : tick_names(p.col_labels, p.cols)) col_em = std::max(col_em, l.em);
    for (size_t j = 0; p.annotate && j < p.values.size(); ++j)
      text_em = std::max(text_em, em_of(cell_text(p.values[j], scale)));
  }
  const double fill = std::min(budget_w / (gcols * max_c), budget_h / (grows * max_r));  // cell size to fill the budget
  const double cs = std::clamp(std::floor(fill), 1.0, max_cell);
  const double afs = text_em > 0 ? std::min(13.0, (cs - 6) / text_em) : 0;  // cell values: when big enough
  const bool annotate = afs >= 7 && 1.3 * afs <= cs;
  // One slot size for all panels. Labels that all panels share go on the left column and wherever
  // nothing is below; they are thinned to every k-th when cells are smaller than a line of text.
  const bool rotate = col_em * fs + 4 > cs;
  const auto row_every = static_cast<int64_t>(std::ceil(1.25 * fs / cs));
  const auto col_every = static_cast<int64_t>(std::ceil((rotate ? 1.25 : col_em + 0.6) * fs / cs));
  const double col_h = rotate ? col_em * fs : fs, mat_w = max_c * cs, mat_h = max_r * cs, top = titled ? 1.7 * pfs : 0;
  const double left = row_em * fs + tick + gap + (yl ? 1.5 * fs : 0), bottom = tick + gap + col_h + (xl ? 1.7 * fs : 0);
  const Label title = label(g.title), xlab = label(g.x_label), ylab = label(g.y_label), cbl = label(g.colorbar_label);
  std::vector<double> mx(gcols), my(grows);
  double x = pad + (ylab.em > 0 ? 1.6 * fs : 0), y = pad + (title.em > 0 ? 2 * tfs : 0);
  for (int64_t c = 0; c < gcols; ++c) mx[c] = x + (c == 0 || !shared_rows ? left : 0), x = mx[c] + mat_w + hgap;
  for (int64_t r = 0; r < grows; ++r)
    my[r] = y + top, y = my[r] + mat_h + (!shared_cols || (r + 2) * gcols - 1 >= n ? bottom : 0) + vgap;
  // The colour bar spans the matrices, but is never shorter than 150 px.
  const double bar_x = x - hgap + 1.5 * fs, bar_w = 16, bar_h = std::max(150.0, my[grows - 1] + mat_h - my[0]);
  Axis bar[2] = {{}, {g.vmin, g.vmax}};  // the colour bar's axis is a y axis for tick_label
  make_ticks(bar[1], bar_h, fs, true);
  const double right = bar_x + bar_w + tick + gap + bar[1].em * fs + (cbl.em > 0 ? 2.2 * fs : 0) + pad;
  const double low = std::max(y - vgap, my[0] + bar_h) + (xlab.em > 0 ? 1.8 * fs : 0) + pad;
  const double W = std::max({right, title.em * tfs + 2 * pad, 1.0 * kMinSide}), H = std::max(low, 1.0 * kMinSide);
  const double sx = (W - right) / 2, sy = (H - low) / 2;  // small or title-wide pictures centre their content
  Page pg(fn, path, W, H);
  pg.ticks(tick);
  for (int64_t i = 0; i < n; ++i) {
    const Heatmap& p = g.panels[i];
    const double x0 = sx + mx[i % gcols], y0 = sy + my[i / gcols], e = 0.5 / cs;  // e: overlap hides AA seams
    const double w = static_cast<double>(p.cols) * cs, h = static_cast<double>(p.rows) * cs;
    pg.area(x0, y0, x0 + w, y0 + h, -0.5, static_cast<double>(p.cols) - 0.5, static_cast<double>(p.rows) - 0.5, -0.5);
    for (int64_t j = 0; j < p.rows * p.cols; ++j) {  // cell (r, c) spans c - 0.5 .. c + 0.5, row 0 on top
      const double v = p.values[j], cx = static_cast<double>(j % p.cols) - 0.5 - e;
      const double cy = static_cast<double>(j / p.cols) - 0.5 - e;
      if (std::isnan(v))
        plcol0(kNanGrey);
      else
        plcol1(std::clamp((v - g.vmin) / (g.vmax - g.vmin), 0.0, 1.0));
      const PLFLT xs[4] = {cx, cx + 1 + 2 * e, cx + 1 + 2 * e, cx}, ys[4] = {cy, cy, cy + 1 + 2 * e, cy + 1 + 2 * e};
      plfill(4, xs, ys);
    }
    const bool show_rows = !shared_rows || i % gcols == 0, show_cols = !shared_cols || i + gcols >= n;  // none below
    plcol0(kInk);
    pg.pen(0.8);
    plbox("bc", 0, 0, "bc", 0, 0);  // frame, then outward ticks at the labelled cells
    plbox(show_cols ? "bit" : "", static_cast<double>(col_every), 0, show_rows ? "bit" : "",
          static_cast<double>(row_every), 0);
    pg.pixels();
    pg.font(afs);
    for (int64_t j = 0; annotate && p.annotate && j < p.rows * p.cols; ++j) {
      const double v = p.values[j];
      plcol0(!std::isnan(v) && (v - g.vmin) / (g.vmax - g.vmin) < 0.6 ? kPage : kInk);
      pg.text(x0 + (static_cast<double>(j % p.cols) + 0.5) * cs, y0 + (static_cast<double>(j / p.cols) + 0.5) * cs,
              cell_text(v, scale), 0.5);
    }
    plcol0(kInk);
    pg.font(fs);
    const std::vector<Label> rows = tick_names(p.row_labels, p.rows), cols = tick_names(p.col_labels, p.cols);
    for (int64_t r = 0; show_rows && r < p.rows; r += row_every)
      pg.text(x0 - tick - gap, y0 + (static_cast<double>(r) + 0.5) * cs, rows[r].pl, 1.0);
    for (int64_t c = 0; show_cols && c < p.cols; c += col_every)
      pg.text(x0 + (static_cast<double>(c) + 0.5) * cs, y0 + h + tick + gap + (rotate ? 0 : 0.5 * fs), cols[c].pl,
              rotate ? 1.0 : 0.5, rotate);
    if (show_rows) pg.text(x0 - left + 0.6 * fs, y0 + h / 2, fit(p.y_label, fs, h + 100).pl, 0.5, true);
    if (show_cols) pg.text(x0 + w / 2, y0 + h + tick + gap + col_h + fs, fit(p.x_label, fs, w + 100).pl, 0.5);
    pg.font(pfs);
    pg.text(x0 + w / 2, y0 - 0.8 * pfs, fit(p.title, pfs, mat_w + hgap).pl, 0.5);
  }
  pg.font(fs);
  pg.text(sx + (mx[0] - left + x - hgap) / 2, H - sy - pad - 0.6 * fs, xlab.pl, 0.5);
  pg.text(sx + pad + 0.6 * fs, sy + (my[0] + y - vgap) / 2, ylab.pl, 0.5, true);
  pg.font(tfs);
  pg.text(W / 2, sy + pad + 0.8 * tfs, title.pl, 0.5);
  pg.area(sx + bar_x, sy + my[0], sx + bar_x + bar_w, sy + my[0] + bar_h, 0, 1, 0, 1);
  pg.font(fs);
  plslabelfunc(tick_label, bar);
  const char *axis = "bcvtmo", *text = cbl.pl.c_str();  // frame, ticks, upright labels on the right
  PLINT label_opt = PL_COLORBAR_LABEL_RIGHT, sub_ticks = 0, n_values = 2;
  PLFLT values[2] = {g.vmin, g.vmax}, bw = 0, bh = 0;
  const PLFLT* value_rows = values;
  plcolorbar(&bw, &bh, PL_COLORBAR_GRADIENT, PL_POSITION_LEFT | PL_POSITION_INSIDE | PL_POSITION_VIEWPORT, 0, 0, 1, 1,
             kPage, kInk, 1, 0, 1, kInk, 0, cbl.em > 0, &label_opt, &text, 1, &axis, &bar[1].step, &sub_ticks,
             &n_values, &value_rows);
  pg.finish();
}

}  // namespace

namespace {

// A line chart's layout, computed (and its input checked) before any file is touched; drawn by
// draw_line_chart at an offset, so that charts can share a picture.
struct ChartPlan {
  const LineChart* ch = nullptr;
  double W = 0, H = 0, k = 1, fs = 0, tfs = 0, ms = 0, pad = 0, lw = 0;
  std::vector<std::vector<std::pair<double, double>>> pts;  // world coordinates; NaN x breaks a line
  std::vector<double> marks;                                // x_marks in world coordinates
  std::vector<size_t> named;
  std::vector<Label> names, mark_names;
  std::vector<bool> marked;  // series drawn with markers
  Axis axes[2];              // x, y
  Label title, xlab, ylab;
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0, swatch = 0, legend_h = 0;
};

ChartPlan plan_line_chart(const LineChart& ch, const char* fn) {
  HL_CHECK(ch.width >= kMinSide && ch.width <= kMaxSide && ch.height >= kMinSide && ch.height <= kMaxSide, fn,
           ": size ", ch.width, " x ", ch.height, " is outside ", kMinSide, "..", kMaxSide, " pixels");
  ChartPlan p;
  p.ch = &ch;
  p.W = ch.width, p.H = ch.height, p.k = std::clamp(std::min(p.W / 800, p.H / 500), 0.7, 4.0);
  const double W = p.W, H = p.H, k = p.k;
  p.fs = 13 * k, p.tfs = 15.5 * k, p.ms = 12 * k, p.pad = 10 * k, p.lw = 1.6 * k;
  const double fs = p.fs, tfs = p.tfs, pad = p.pad;
  p.pts.resize(ch.series.size());
  std::vector<size_t> finite(ch.series.size());
  double lo[2] = {HUGE_VAL, HUGE_VAL}, hi[2] = {-HUGE_VAL, -HUGE_VAL}, name_em = 0;
  for (size_t i = 0; i < ch.series.size(); ++i) {
    const Series& s = ch.series[i];
    const std::string name = s.name.empty() ? std::string("#").append(std::to_string(i)) : "'" + s.name + "'";
    HL_CHECK(s.x.size() == s.y.size(), fn, ": series ", name, " has ", s.x.size(), " x values but ", s.y.size(),
             " y values");
    for (size_t j = 0; j < s.x.size(); ++j) {
      const bool ok = std::isfinite(s.x[j]) && std::isfinite(s.y[j]);
      HL_CHECK(!ok || !ch.log_x || s.x[j] > 0, fn, ": log_x needs x > 0; series ", name, " has x[", j, "] = ", s.x[j]);
      HL_CHECK(!ok || !ch.log_y || s.y[j] > 0, fn, ": log_y needs y > 0; series ", name, " has y[", j, "] = ", s.y[j]);
      const double w[2] = {ch.log_x ? std::log10(s.x[j]) : s.x[j], ch.log_y ? std::log10(s.y[j]) : s.y[j]};
      p.pts[i].emplace_back(ok ? w[0] : NAN, w[1]);
      for (int a = 0; a < 2 && ok; ++a) lo[a] = std::min(lo[a], w[a]), hi[a] = std::max(hi[a], w[a]);
      finite[i] += ok;
    }
    if (s.name.empty()) continue;
    p.named.push_back(i), p.names.push_back(fit(s.name, fs, W / 3)), name_em = std::max(name_em, p.names.back().em);
  }
  for (const XMark& m : ch.x_marks) {  // a mark widens the x range (never the y range) so that it shows
    HL_CHECK(std::isfinite(m.x) && (!ch.log_x || m.x > 0), fn, ": x mark '", m.name, "' at ", m.x, " cannot be drawn",
             ch.log_x ? " on a log x axis" : "");
    p.marks.push_back(ch.log_x ? std::log10(m.x) : m.x);
    p.mark_names.push_back(fit(m.name, fs, W / 4));
    lo[0] = std::min(lo[0], p.marks.back()), hi[0] = std::max(hi[0], p.marks.back());
  }
  for (int a = 0; a < 2; ++a) {  // the data range with matplotlib's 5% margins; empty axes when none is finite
    p.axes[a].log = a ? ch.log_y : ch.log_x;
    if (lo[a] > hi[a]) continue;
    HL_CHECK(std::isfinite(hi[a] - lo[a]), fn, ": ", a ? "y" : "x", " range is too large to draw");
    const bool flat = hi[a] - lo[a] <= 1e-9 * std::max(std::abs(lo[a]), std::abs(hi[a]));
    const double d = !flat ? 0.05 * (hi[a] - lo[a]) : p.axes[a].log ? 0.5 : lo[a] == 0 ? 1 : std::abs(lo[a]) * 0.1;
    p.axes[a].lo = lo[a] - d, p.axes[a].hi = hi[a] + d;
    if (p.axes[a].log && std::floor(p.axes[a].hi) - std::ceil(p.axes[a].lo) < 1)  // whole decades, for 2 labels
      p.axes[a].lo = std::floor(lo[a]), p.axes[a].hi = std::max(std::ceil(hi[a]), p.axes[a].lo + 1);
  }
  Axis &ax = p.axes[0], &ay = p.axes[1];
  p.title = fit(ch.title, tfs, W - 2 * pad), p.xlab = fit(ch.x_label, fs, W - 2 * pad);
  p.ylab = fit(ch.y_label, fs, H - 2 * pad);
  p.y0 = pad + (p.title.em > 0 ? 2 * tfs : 0.6 * fs), p.y1 = H - pad - (p.xlab.em > 0 ? 3.4 : 2) * fs;
  make_ticks(ay, p.y1 - p.y0, fs, true);
  // The legend sits right of the plot, where it covers no data. Its size is pllegend's own sum:
  // borders and text offset (1.4 character heights, scaled by the aspect ratio), names, line sample;
  // rows of 2 character heights. PLplot's character height is 0.75 em here (see Page::font).
  p.swatch = 2.5 * fs, p.legend_h = 1.5 * fs * static_cast<double>(p.names.size());
  const double legend_w = p.names.empty() ? 0 : 1.05 * fs * W / H + name_em * fs + p.swatch + 2 * fs;
  p.x0 = pad + (p.ylab.em > 0 ? 1.6 * fs : 0) + (ay.em + 0.8) * fs, p.x1 = W - pad - fs - legend_w;
  make_ticks(ax, p.x1 - p.x0, fs, false);
  p.marked.resize(p.pts.size());  // markers, unless so dense that they would only smear the line
  for (size_t i = 0; i < p.pts.size(); ++i) p.marked[i] = (p.x1 - p.x0) / (std::max<double>(finite[i], 2) - 1) >= 7 * k;
  return p;
}

// Draws the chart with its top-left corner at pixel (ox, oy) of the page.
void draw_line_chart(Page& pg, ChartPlan& p, double ox, double oy) {
  static const char* const kMarkers[8] = {"●", "■", "▲", "◆", "▼", "⬟", "✖", "★"};  // apart in grey print too
  const double k = p.k, fs = p.fs, tfs = p.tfs, ms = p.ms, pad = p.pad, lw = p.lw, W = p.W, H = p.H;
  const double x0 = ox + p.x0, x1 = ox + p.x1, y0 = oy + p.y0, y1 = oy + p.y1;
  Axis &ax = p.axes[0], &ay = p.axes[1];
  pg.area(x0, y0, x1, y1, ax.lo, ax.hi, ay.lo, ay.hi);
  plslabelfunc(tick_label, p.axes);
  pg.ticks(4 * k);
  plcol0(kGridInk);
  pg.pen(0.8 * k);
  plbox(ax.log ? "gl" : "g", ax.step, 0, ay.log ? "gl" : "g", ay.step, 0);
  for (size_t i = 0; i < p.pts.size(); ++i) {
    std::vector<PLFLT> xs, ys, mx, my;  // the run of finite points under way; markers
    plcol0(kTab10 + static_cast<PLINT>(i % 10));
    pg.pen(lw);
    for (size_t j = 0; j <= p.pts[i].size(); ++j) {
      if (j < p.pts[i].size() && !std::isnan(p.pts[i][j].first)) {
        xs.push_back(p.pts[i][j].first), ys.push_back(p.pts[i][j].second);
        if (p.marked[i]) mx.push_back(xs.back()), my.push_back(ys.back());
        continue;
      }
      if (xs.size() > 1) plline(static_cast<PLINT>(xs.size()), xs.data(), ys.data());
      if (xs.size() == 1 && !p.marked[i]) mx.push_back(xs[0]), my.push_back(ys[0]);  // a lone point is a marker
      xs.clear(), ys.clear();
    }
    pg.font(ms);
    plstring(static_cast<PLINT>(mx.size()), mx.data(), my.data(), kMarkers[i % 8]);
  }
  plcol0(kInk);  // x marks: dashed lines across the plot, named at the top
  pg.pen(lw);
  pg.font(fs);
  for (size_t m = 0; m < p.marks.size(); ++m) {
    PLFLT mx[2] = {p.marks[m], p.marks[m]}, my[2] = {ay.lo, ay.hi};
    pllsty(2);
    plline(2, mx, my);
    pllsty(1);
    plptex(p.marks[m], ay.hi - 0.04 * (ay.hi - ay.lo), 1, 0, -0.05, p.mark_names[m].pl.c_str());
  }
  pg.pen(k);
  pg.font(fs);  // frame, outward ticks (minor ones on log axes), labels by tick_label, upright on y
  plbox("c", 0, 0, "c", 0, 0);
  plbox(ax.log ? "binstlo" : "binto", ax.step, 0, ay.log ? "binstlvo" : "bintvo", ay.step, 0);
  pg.pixels();
  pg.text((x0 + x1) / 2, oy + H - pad - 0.6 * fs, p.xlab.pl, 0.5);
  pg.text(ox + pad + 0.6 * fs, (y0 + y1) / 2, p.ylab.pl, 0.5, true);
  pg.font(tfs);
  pg.text(ox + W / 2, oy + pad + 0.8 * tfs, p.title.pl, 0.5);
  if (const size_t n = p.names.size(); n > 0) {
    pg.area(x0, y0, x1, y1, 0, 1, 0, 1);
    pg.font(fs);
    std::vector<PLINT> opts(n), ink(n, kInk), colours(n), styles(n, 1), counts(n, 1);
    std::vector<PLFLT> widths(n, pg.pen(lw)), scales(n, ms / fs);
    std::vector<const char*> texts(n), glyphs(n);
    for (size_t e = 0; e < n; ++e) {
      opts[e] = PL_LEGEND_LINE | (p.marked[p.named[e]] ? PL_LEGEND_SYMBOL : 0);
      colours[e] = kTab10 + static_cast<PLINT>(p.named[e] % 10);
      texts[e] = p.names[e].pl.c_str(), glyphs[e] = kMarkers[p.named[e] % 8];
    }
    PLFLT lw_out = 0, lh_out = 0;
    pllegend(&lw_out, &lh_out, PL_LEGEND_BACKGROUND | PL_LEGEND_BOUNDING_BOX,
             PL_POSITION_OUTSIDE | PL_POSITION_TOP | PL_POSITION_RIGHT | PL_POSITION_VIEWPORT, fs / (x1 - x0),
             -p.legend_h / (y1 - y0), p.swatch / (x1 - x0), kPage, kFrame, 1, static_cast<PLINT>(n), 1,
             static_cast<PLINT>(n), opts.data(), 0.6, 1.0, 2.0, 0, ink.data(), texts.data(), nullptr, nullptr, nullptr,
             nullptr, colours.data(), styles.data(), widths.data(), colours.data(), scales.data(), counts.data(),
             glyphs.data());
  }
}

}  // namespace

void save_line_chart(const LineChart& chart, const std::string& path) { save_line_charts({chart}, path); }

void save_line_charts(const std::vector<LineChart>& charts, const std::string& path) {
  constexpr const char* fn = "save_line_chart";
  HL_CHECK(!charts.empty(), fn, ": no chart to draw into '", path, "'");
  std::vector<ChartPlan> plans;
  double W = 0, H = 0;
  for (const LineChart& ch : charts) {
    plans.push_back(plan_line_chart(ch, fn));
    W += plans.back().W, H = std::max(H, plans.back().H);
  }
  Page pg(fn, path, W, H);
  double ox = 0;
  for (ChartPlan& p : plans) draw_line_chart(pg, p, ox, 0), ox += p.W;
  pg.finish();
}

void save_heatmap(const Heatmap& map, const std::string& path) {
  constexpr const char* fn = "save_heatmap";
  validate_panel(map, fn);
  HL_CHECK(std::isfinite(map.vmin.value_or(0)) && std::isfinite(map.vmax.value_or(0)), fn,
           ": vmin and vmax must be finite, got ", map.vmin.value_or(0), " and ", map.vmax.value_or(0));
  HL_CHECK(!map.vmin || !map.vmax || *map.vmin < *map.vmax, fn, ": vmin (", map.vmin.value_or(0),
           ") must be less than vmax (", map.vmax.value_or(0), ")");
  double lo = HUGE_VAL, hi = -HUGE_VAL;
  for (double v : map.values)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (lo > hi) lo = 0, hi = 1;  // nothing finite: every cell is grey, any range will do
  lo = map.vmin.value_or(map.vmax && *map.vmax <= lo ? *map.vmax - 1 : lo);  // one bound beyond the data: keep it
  hi = map.vmax.value_or(map.vmin && *map.vmin >= hi ? *map.vmin + 1 : hi);
  if (!(hi - lo > 1e-12 * std::max(std::abs(lo), std::abs(hi)))) {  // all equal: they take the middle colour
    const double d = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= d, hi += d;
  }
  HL_CHECK(std::isfinite(hi - lo), fn, ": value range [", lo, ", ", hi, "] is too large to draw");
  HeatmapGrid g{map.title, "", "", map.colorbar_label, 1, 1, {map}, lo, hi};
  g.panels[0].title.clear();  // the map's title is the figure's
  draw_grid(fn, g, path, 640, 480, 64);
}

void save_heatmap_grid(const HeatmapGrid& grid, const std::string& path) {
  constexpr const char* fn = "save_heatmap_grid";
  HL_CHECK(grid.grid_rows >= 1 && grid.grid_cols >= 1 && grid.grid_rows <= 256 && grid.grid_cols <= 256, fn,
           ": grid must be 1..256 x 1..256 panels, got ", grid.grid_rows, " x ", grid.grid_cols);
  HL_CHECK(!grid.panels.empty(), fn, ": no panels");
  HL_CHECK(static_cast<int64_t>(grid.panels.size()) <= grid.grid_rows * grid.grid_cols, fn, ": ", grid.panels.size(),
           " panels do not fit a ", grid.grid_rows, " x ", grid.grid_cols, " grid");
  HL_CHECK(std::isfinite(grid.vmin) && std::isfinite(grid.vmax) && std::isfinite(grid.vmax - grid.vmin) &&
               grid.vmin < grid.vmax,
           fn, ": need finite vmin < vmax, got [", grid.vmin, ", ", grid.vmax, "]");
  for (size_t i = 0; i < grid.panels.size(); ++i)
    validate_panel(grid.panels[i], std::string(fn) + ": panel " + std::to_string(i) +
                                       (grid.panels[i].title.empty() ? "" : " ('" + grid.panels[i].title + "')"));
  draw_grid(fn, grid, path, 1800, 1400, 40);
}

}  // namespace headlab::plot
