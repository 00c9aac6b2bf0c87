// Rasteriser behind train/plot.h: an RGB canvas (lines, rectangles, markers, stb_easy_font text at
// integer scales, upright or turned 90 degrees), nice-number axis ticks, the viridis map, and the
// layouts of the three pictures. PNG encoding comes from Debian's libstb (link -lstb).
#include "train/plot.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string_view>

#include "autograd/error.h"

// Debian's libstb.so already holds stb_image_write's implementation: the build defines
// HEADLAB_STB_SHARED when it links that library (-lstb) and only declarations are needed here.
// Without it the implementation is compiled into this file, static so that it can never clash.
// stb_easy_font is all static functions and always lives in this translation unit.
#ifndef HEADLAB_STB_SHARED
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#endif
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wconversion"
#pragma GCC diagnostic ignored "-Wold-style-cast"
#pragma GCC diagnostic ignored "-Wcast-align"
#include <stb/stb_easy_font.h>
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

namespace headlab::plot {

Rgb series_color(size_t i) {
  // matplotlib's tab10: distinct hues that stay apart for colour-blind readers too.
  static constexpr std::array<Rgb, 10> kTab10 = {{{31, 119, 180},
                                                  {255, 127, 14},
                                                  {44, 160, 44},
                                                  {214, 39, 40},
                                                  {148, 103, 189},
                                                  {140, 86, 75},
                                                  {227, 119, 194},
                                                  {127, 127, 127},
                                                  {188, 189, 34},
                                                  {23, 190, 207}}};
  return kTab10[i % kTab10.size()];
}

Rgb nan_color() { return {192, 192, 192}; }
Rgb background_color() { return {255, 255, 255}; }

Rgb viridis(double t) {
  // matplotlib's viridis (van der Walt & Smith), every 8th of its 256 entries plus the last;
  // linear interpolation between them stays within about one 8-bit step of the full table.
  static constexpr std::array<std::array<float, 3>, 33> kPoints = {{
      {0.2670040f, 0.0048743f, 0.3294152f}, {0.2770184f, 0.0503444f, 0.3757145f},
      {0.2823274f, 0.0949555f, 0.4173309f}, {0.2828839f, 0.1359201f, 0.4534273f},
      {0.2788262f, 0.1754902f, 0.4833965f}, {0.2705947f, 0.2140690f, 0.5070524f},
      {0.2589645f, 0.2515369f, 0.5247361f}, {0.2449721f, 0.2876755f, 0.5372602f},
      {0.2297393f, 0.3223613f, 0.5457063f}, {0.2142976f, 0.3556191f, 0.5511844f},
      {0.1994295f, 0.3876068f, 0.5546421f}, {0.1855559f, 0.4185704f, 0.5567529f},
      {0.1727188f, 0.4487906f, 0.5578853f}, {0.1606647f, 0.4785396f, 0.5581147f},
      {0.1490392f, 0.5080514f, 0.5572505f}, {0.1377705f, 0.5374921f, 0.5549063f},
      {0.1275677f, 0.5669489f, 0.5505555f}, {0.1205650f, 0.5964219f, 0.5436106f},
      {0.1206382f, 0.6258283f, 0.5334883f}, {0.1322680f, 0.6550136f, 0.5196609f},
      {0.1578515f, 0.6837653f, 0.5016857f}, {0.1965706f, 0.7118267f, 0.4792211f},
      {0.2460697f, 0.7389097f, 0.4520241f}, {0.3041480f, 0.7647043f, 0.4199435f},
      {0.3692142f, 0.7888879f, 0.3829144f}, {0.4401369f, 0.8111384f, 0.3409673f},
      {0.5159918f, 0.8311578f, 0.2942789f}, {0.5958393f, 0.8487172f, 0.2433288f},
      {0.6784887f, 0.8637421f, 0.1895033f}, {0.7623734f, 0.8764239f, 0.1370645f},
      {0.8455606f, 0.8873224f, 0.0997022f}, {0.9261058f, 0.8973298f, 0.1040707f},
      {0.9932479f, 0.9061566f, 0.1439362f},
  }};
  if (std::isnan(t)) return nan_color();
  const double pos = std::clamp(t, 0.0, 1.0) * 255.0;  // index into the 256-entry table
  const int i = std::min(static_cast<int>(pos / 8.0), 31);
  const double x0 = i * 8.0, x1 = (i == 31) ? 255.0 : x0 + 8.0;
  const double f = std::clamp((pos - x0) / (x1 - x0), 0.0, 1.0);
  auto channel = [&](int c) {
    const double v = kPoints[i][c] + f * (kPoints[i + 1][c] - kPoints[i][c]);
    return static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 1.0) * 255.0));
  };
  return {channel(0), channel(1), channel(2)};
}

namespace {

constexpr Rgb kInk{34, 34, 34};       // text and axes
constexpr Rgb kGrid{228, 228, 228};   // grid lines behind the data
constexpr Rgb kFrame{170, 170, 170};  // legend box
constexpr int kMaxSide = 8000;        // pixels; keeps a bad argument from allocating gigabytes

// ---------------------------------------------------------------------------------------------
// Canvas: RGB pixels with a clip rectangle; everything outside the canvas or clip is ignored.

class Canvas {
 public:
  Canvas(int w, int h, Rgb bg) : w_(w), h_(h), px_(static_cast<size_t>(w) * h * 3) {
    for (size_t i = 0; i < px_.size(); i += 3) {
      px_[i] = bg.r;
      px_[i + 1] = bg.g;
      px_[i + 2] = bg.b;
    }
    reset_clip();
  }
  int width() const { return w_; }
  int height() const { return h_; }
  const std::vector<uint8_t>& pixels() const { return px_; }

  void set_clip(int x0, int y0, int x1, int y1) {  // half-open [x0, x1) x [y0, y1)
    cx0_ = std::max(0, x0);
    cy0_ = std::max(0, y0);
    cx1_ = std::min(w_, x1);
    cy1_ = std::min(h_, y1);
  }
  void reset_clip() { set_clip(0, 0, w_, h_); }

  void put(int x, int y, Rgb c) {
    if (x < cx0_ || x >= cx1_ || y < cy0_ || y >= cy1_) return;
    uint8_t* p = &px_[(static_cast<size_t>(y) * w_ + x) * 3];
    p[0] = c.r;
    p[1] = c.g;
    p[2] = c.b;
  }

  void fill_rect(int x, int y, int w, int h, Rgb c) {
    const int x0 = std::max(x, cx0_), x1 = std::min(x + w, cx1_);
    const int y0 = std::max(y, cy0_), y1 = std::min(y + h, cy1_);
    for (int yy = y0; yy < y1; ++yy)
      for (int xx = x0; xx < x1; ++xx) put(xx, yy, c);
  }
  void frame_rect(int x, int y, int w, int h, Rgb c) {  // 1 px outline inside [x, x+w) x [y, y+h)
    fill_rect(x, y, w, 1, c);
    fill_rect(x, y + h - 1, w, 1, c);
    fill_rect(x, y, 1, h, c);
    fill_rect(x + w - 1, y, 1, h, c);
  }

  // Bresenham with a square pen of side `thick`; the segment is clipped first so that a wild
  // coordinate cannot make the loop run for billions of steps.
  void line(double x0, double y0, double x1, double y1, Rgb c, int thick) {
    const double m = thick + 1.0;
    if (!clip_segment(x0, y0, x1, y1, cx0_ - m, cy0_ - m, cx1_ + m, cy1_ + m)) return;
    int ax = static_cast<int>(std::lround(x0)), ay = static_cast<int>(std::lround(y0));
    const int bx = static_cast<int>(std::lround(x1)), by = static_cast<int>(std::lround(y1));
    const int dx = std::abs(bx - ax), dy = -std::abs(by - ay);
    const int sx = ax < bx ? 1 : -1, sy = ay < by ? 1 : -1;
    const int off = (thick - 1) / 2;
    int err = dx + dy;
    while (true) {
      fill_rect(ax - off, ay - off, thick, thick, c);
      if (ax == bx && ay == by) break;
      const int e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        ax += sx;
      }
      if (e2 <= dx) {
        err += dx;
        ay += sy;
      }
    }
  }

 private:
  // Liang-Barsky: shrinks the segment to the box; false when nothing of it is inside.
  static bool clip_segment(double& x0, double& y0, double& x1, double& y1, double bx0, double by0,
                           double bx1, double by1) {
    double t0 = 0, t1 = 1;
    const double dx = x1 - x0, dy = y1 - y0;
    const double p[4] = {-dx, dx, -dy, dy};
    const double q[4] = {x0 - bx0, bx1 - x0, y0 - by0, by1 - y0};
    for (int i = 0; i < 4; ++i) {
      if (p[i] == 0) {
        if (q[i] < 0) return false;
        continue;
      }
      const double r = q[i] / p[i];
      if (p[i] < 0)
        t0 = std::max(t0, r);
      else
        t1 = std::min(t1, r);
      if (t0 > t1) return false;
    }
    const double nx0 = x0 + t0 * dx, ny0 = y0 + t0 * dy;
    x1 = x0 + t1 * dx;
    y1 = y0 + t1 * dy;
    x0 = nx0;
    y0 = ny0;
    return true;
  }

  int w_, h_;
  std::vector<uint8_t> px_;
  int cx0_ = 0, cy0_ = 0, cx1_ = 0, cy1_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Text: stb_easy_font turned into per-glyph pixel lists once, drawn by stamping scale x scale
// squares. Glyph cells: caps occupy rows 0..6, descenders rows 7..8, so a line is 9 px at 1x.

constexpr int kCapH = 7;   // 1x height of capitals and digits
constexpr int kLineH = 9;  // 1x height including descenders

struct Glyph {
  int advance = 0;  // includes one column of spacing
  std::vector<std::pair<int8_t, int8_t>> dots;
};

const std::array<Glyph, 95>& glyphs() {
  static const std::array<Glyph, 95> table = [] {
    std::array<Glyph, 95> out;
    for (int c = 32; c < 127; ++c) {
      char text[2] = {static_cast<char>(c), 0};
      // 4 vertices of 16 bytes (x, y, z, rgba) per quad; room for 64 quads, a glyph uses < 20.
      std::array<float, 64 * 16> vbuf{};
      const int quads = stb_easy_font_print(0, 0, text, nullptr, vbuf.data(),
                                            static_cast<int>(sizeof(float) * vbuf.size()));
      std::array<std::array<bool, 16>, 16> lit{};
      for (int q = 0; q < quads; ++q) {
        const float* v0 = &vbuf[q * 16];  // vertex 0 and vertex 2 are opposite corners
        const float* v2 = &vbuf[q * 16 + 8];
        for (int y = static_cast<int>(v0[1]); y < static_cast<int>(v2[1]); ++y)
          for (int x = static_cast<int>(v0[0]); x < static_cast<int>(v2[0]); ++x)
            if (x >= 0 && x < 16 && y >= 0 && y < 16) lit[y][x] = true;
      }
      Glyph& g = out[c - 32];
      g.advance = stb_easy_font_width(text);
      for (int y = 0; y < 16; ++y)
        for (int x = 0; x < 16; ++x)
          if (lit[y][x]) g.dots.emplace_back(static_cast<int8_t>(x), static_cast<int8_t>(y));
    }
    return out;
  }();
  return table;
}

// The font is ASCII only: control characters and UTF-8 sequences become '?' (one per sequence),
// newline and tab are spelled out, since token strings from a tokenizer may be exactly those.
std::string printable(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c == '\r')
      out += "\\r";
    else if (c >= 32 && c < 127)
      out += static_cast<char>(c);
    else if (c >= 0x80 && c < 0xC0)
      continue;  // UTF-8 continuation byte: already shown
    else
      out += '?';
  }
  return out;
}

int text_width(std::string_view s, int scale) {  // s must be printable()
  int w = 0;
  for (char c : s) w += glyphs()[static_cast<unsigned char>(c) - 32].advance;
  return s.empty() ? 0 : (w - 1) * scale;  // the last glyph's spacing column is not ink
}

enum class Align { start, center, end };

// Draws printable text. Upright: (x, y) is aligned against the box [text width] x [cap height].
// Vertical reads bottom to top (turned 90 degrees counter-clockwise, as y-axis labels are); the
// box is then [cap height] x [text width] on screen and descenders poke out to the right.
void draw_text(Canvas& cv, std::string_view s, int x, int y, int scale, Rgb color, Align h, Align v,
               bool vertical = false) {
  const int tw = text_width(s, scale), th = kCapH * scale;
  const int bw = vertical ? th : tw, bh = vertical ? tw : th;
  const int x0 = h == Align::start ? x : h == Align::center ? x - bw / 2 : x - bw;
  const int y0 = v == Align::start ? y : v == Align::center ? y - bh / 2 : y - bh;
  int pen = 0;
  for (char c : s) {
    const Glyph& g = glyphs()[static_cast<unsigned char>(c) - 32];
    for (auto [gx, gy] : g.dots) {
      const int u = pen + gx * scale, w = gy * scale;  // along / across the text
      if (vertical)
        cv.fill_rect(x0 + w, y0 + tw - scale - u, scale, scale, color);
      else
        cv.fill_rect(x0 + u, y0 + w, scale, scale, color);
    }
    pen += g.advance * scale;
  }
}

// Shortens printable text with ".." until it fits max_w (an empty string when nothing fits).
std::string fit_text(std::string s, int scale, int max_w) {
  if (text_width(s, scale) <= max_w) return s;
  const int dots_w = text_width("..", scale) + scale;  // plus the spacing column before them
  int w = 0;
  size_t keep = 0;  // one pass, so that a megabyte-long title costs no more than reading it
  for (; keep < s.size(); ++keep) {
    const int next = w + glyphs()[static_cast<unsigned char>(s[keep]) - 32].advance * scale;
    if (next - scale + dots_w > max_w) break;
    w = next;
  }
  return keep == 0 ? std::string() : s.substr(0, keep) + "..";
}

// ---------------------------------------------------------------------------------------------
// Ticks

struct Ticks {
  std::vector<double> values;  // in data units
  std::vector<std::string> labels;
};

double nice_step(double raw) {  // 1, 2 or 5 times a power of ten, >= raw
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0) * mag;
}

// "1e+05" -> "1e5", "2.5e-07" -> "2.5e-7": the long exponent form wastes tick-label room.
std::string tidy_exponent(std::string s) {
  const auto e = s.find('e');
  if (e == std::string::npos) return s;
  std::string mant = s.substr(0, e), exp = s.substr(e + 1);
  const bool neg = !exp.empty() && exp[0] == '-';
  if (!exp.empty() && (exp[0] == '+' || exp[0] == '-')) exp.erase(0, 1);
  while (exp.size() > 1 && exp[0] == '0') exp.erase(0, 1);
  return mant + "e" + (neg ? "-" : "") + exp;
}

// Labels for ticks spaced `step` apart within values up to `maxabs`: fixed point with just
// enough decimals to tell neighbours apart, exponent form for very large or tiny numbers.
std::string format_tick(double v, double step, double maxabs) {
  char buf[64];
  if (std::abs(v) < step * 1e-6) v = 0;  // no "-0.0" from rounding
  if (maxabs < 1e5 && step >= 1e-4) {
    const int decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
    std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  } else if (v == 0) {
    return "0";
  } else {
    const int digits = std::clamp(
        static_cast<int>(std::floor(std::log10(maxabs)) - std::floor(std::log10(step))) + 1, 1, 15);
    std::snprintf(buf, sizeof(buf), "%.*e", digits - 1, v);
    return tidy_exponent(buf);
  }
  return buf;
}

std::vector<double> linear_tick_values(double lo, double hi, double step) {
  std::vector<double> out;
  const double k0 = std::ceil(lo / step - 1e-9), k1 = std::floor(hi / step + 1e-9);
  for (double k = k0; k <= k1 && out.size() < 1000; k += 1) {
    const double v = k * step;
    out.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  return out;
}

// Ticks about `min_px` apart or wider whose labels do not collide (`fits` is told the pixel
// spacing and the labels); at least two when any two fit, so that the scale can be read.
template <typename Fits>
Ticks linear_ticks(double lo, double hi, double len_px, double min_px, Fits fits) {
  const double maxabs = std::max(std::abs(lo), std::abs(hi));
  auto make = [&](double step) {
    Ticks t;
    t.values = linear_tick_values(lo, hi, step);
    for (double v : t.values) t.labels.push_back(format_tick(v, step, maxabs));
    return t;
  };
  // Steps run through 1-2-5 x 10^e, kept as (mantissa index, exponent) to avoid drift.
  static constexpr double kMant[3] = {1, 2, 5};
  const double s0 = nice_step((hi - lo) / std::max(1.0, len_px / min_px));
  if (!(s0 > 0) || !std::isfinite(s0)) return {};  // cannot happen after widen(); no UB if it does
  int e0 = static_cast<int>(std::floor(std::log10(s0) + 1e-9));
  const double m0 = s0 / std::pow(10.0, e0);
  int i0 = m0 < 1.5 ? 0 : m0 < 3.5 ? 1 : m0 < 7.5 ? 2 : 0;
  if (m0 >= 7.5) ++e0;
  auto step_at = [&](int k) {  // k-th step from s0, negative k = finer
    const int idx = i0 + k, e = e0 + static_cast<int>(std::floor(idx / 3.0));
    return kMant[((idx % 3) + 3) % 3] * std::pow(10.0, e);
  };
  Ticks single;
  for (int k = 0; k < 6; ++k) {  // coarser until the labels fit
    const Ticks t = make(step_at(k));
    if (!fits(step_at(k) / (hi - lo) * len_px, t.labels)) continue;
    if (t.values.size() >= 2) return t;
    if (single.values.empty()) single = t;
    break;  // coarser steps only lose more ticks
  }
  for (int k = -1; k >= -3; --k) {  // too few: finer steps, as long as labels still fit
    const Ticks t = make(step_at(k));
    if (t.values.size() >= 2 && fits(step_at(k) / (hi - lo) * len_px, t.labels)) return t;
  }
  return single.values.empty() ? make(step_at(0)) : single;
}

// Ticks of a log10 axis spanning [10^lo, 10^hi]: decades when three or more fit (thinned to
// every 2nd, 3rd.. decade when crowded), else 1-2-5 multiples, else 1..9 multiples, else plain
// nice values for a range narrower than a factor of ~3.
template <typename Fits>
Ticks log_ticks(double lo, double hi, double len_px, double min_px, Fits fits) {
  const int max_ticks = std::max(2, static_cast<int>(len_px / min_px));
  auto label = [](double v) {
    char buf[32];
    const double e = std::floor(std::log10(v) + 1e-9);
    if (e >= -3 && e <= 4)
      std::snprintf(buf, sizeof(buf), "%g", v);
    else
      std::snprintf(buf, sizeof(buf), "%.0e", v);
    return tidy_exponent(buf);
  };
  auto make = [&](const std::vector<int>& mults, int every) {
    Ticks t;
    for (int d = static_cast<int>(std::floor(lo)); d <= static_cast<int>(std::ceil(hi)); ++d) {
      if (((d % every) + every) % every != 0) continue;
      for (int m : mults) {
        const double v = m * std::pow(10.0, d), lv = std::log10(v);
        if (lv < lo - 1e-9 || lv > hi + 1e-9) continue;
        t.values.push_back(v);
        t.labels.push_back(label(v));
      }
    }
    return t;
  };
  auto ok = [&](const Ticks& t) {  // the closest pair on screen decides whether labels collide
    if (t.values.size() < 2 || static_cast<int>(t.values.size()) > max_ticks) return false;
    double gap = len_px;
    for (size_t i = 1; i < t.values.size(); ++i)
      gap = std::min(gap,
                     (std::log10(t.values[i]) - std::log10(t.values[i - 1])) / (hi - lo) * len_px);
    return fits(gap, t.labels);
  };
  const int decades =
      static_cast<int>(std::floor(hi + 1e-9)) - static_cast<int>(std::ceil(lo - 1e-9)) + 1;
  if (decades >= 3)
    for (int every = 1; every <= decades; ++every)
      if (Ticks t = make({1}, every); t.values.size() >= 2 && ok(t)) return t;
  for (const std::vector<int>& mults :
       {std::vector<int>{1, 2, 5}, {1}, {1, 2, 3, 4, 5, 6, 7, 8, 9}})
    if (Ticks t = make(mults, 1); ok(t)) return t;
  const double vlo = std::pow(10.0, lo), vhi = std::pow(10.0, hi);
  return linear_ticks(vlo, vhi, len_px, min_px, [&](double, const std::vector<std::string>& l) {
    // spacing on a log axis shrinks towards the top; judge by a conservative average
    return fits(len_px / (static_cast<double>(l.size()) + 1) * 0.8, l);
  });
}

// Expands a degenerate range (one point, all values equal) so that it maps to the middle. Spans
// below 1e-300 count as degenerate too: their tick steps would underflow to zero.
void widen(double& lo, double& hi) {
  if (hi > lo && hi - lo > 1e-12 * std::max(std::abs(lo), std::abs(hi)) && hi - lo > 1e-300) return;
  const double d = lo == 0 ? 1.0 : std::max(std::abs(lo) * 0.1, 1e-300);
  lo -= d;
  hi += d;
}

// ---------------------------------------------------------------------------------------------
// Output

void write_png(const Canvas& cv, const std::string& path, const char* fn) {
  HL_CHECK(!path.empty(), fn, ": empty output path");
  std::vector<unsigned char> png;
  auto sink = [](void* ctx, void* data, int size) {
    auto* out = static_cast<std::vector<unsigned char>*>(ctx);
    const auto* p = static_cast<const unsigned char*>(data);
    out->insert(out->end(), p, p + size);
  };
  // Encode in memory, then write with stdio ourselves: stbi_write_png would only say "0" on
  // failure, while the user needs the path and errno's reason.
  const int ok = stbi_write_png_to_func(sink, &png, cv.width(), cv.height(), 3, cv.pixels().data(),
                                        cv.width() * 3);
  HL_CHECK(ok && !png.empty(), fn, ": PNG encoding failed for '", path, "'");
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f)
    HL_FAIL("plot: cannot write '", path, "': ", std::strerror(errno),
            " (does the directory exist and is it writable?)");
  const size_t written = std::fwrite(png.data(), 1, png.size(), f);
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (written != png.size() || !closed) {
    const int e = written != png.size() ? write_errno : errno;
    std::remove(path.c_str());  // no half-written picture under the real name
    HL_FAIL("plot: cannot write '", path, "': ", std::strerror(e), " (disk full?)");
  }
}

void check_size(const char* fn, const char* what, int64_t w, int64_t h) {
  HL_CHECK(w >= 1 && h >= 1 && w <= kMaxSide && h <= kMaxSide, fn, ": ", what, " would be ", w,
           " x ", h, " pixels, outside 1..", kMaxSide);
}

// ---------------------------------------------------------------------------------------------
// Markers: a different shape per series, so lines stay apart in grey print too.

enum class Marker { circle, square, triangle_up, diamond, triangle_down, cross, plus };

Marker marker_of(size_t i) {
  static constexpr std::array<Marker, 7> kOrder = {
      Marker::circle,        Marker::square, Marker::triangle_up, Marker::diamond,
      Marker::triangle_down, Marker::cross,  Marker::plus};
  return kOrder[i % kOrder.size()];
}

void draw_marker(Canvas& cv, double cx, double cy, int r, Marker m, Rgb c) {
  const int x0 = static_cast<int>(std::lround(cx)), y0 = static_cast<int>(std::lround(cy));
  const int t = std::max(1, r / 2);  // stroke half-width of cross and plus
  for (int dy = -r - 1; dy <= r + 1; ++dy) {
    for (int dx = -r - 1; dx <= r + 1; ++dx) {
      bool in = false;
      switch (m) {
        case Marker::circle:
          in = dx * dx + dy * dy <= r * r + r / 2;
          break;
        case Marker::square:
          in = std::abs(dx) <= r - 1 && std::abs(dy) <= r - 1;
          break;
        case Marker::diamond:
          in = std::abs(dx) + std::abs(dy) <= r + 1;
          break;
        case Marker::triangle_up:
          in = dy >= -r - 1 && dy <= r - 1 && 2 * std::abs(dx) <= dy + r + 1 + r / 2;
          break;
        case Marker::triangle_down:
          in = dy <= r + 1 && dy >= -r + 1 && 2 * std::abs(dx) <= -dy + r + 1 + r / 2;
          break;
        case Marker::cross:
          in = std::abs(std::abs(dx) - std::abs(dy)) < t && std::abs(dx) <= r;
          break;
        case Marker::plus:
          in = (std::abs(dx) < t && std::abs(dy) <= r + 1) ||
               (std::abs(dy) < t && std::abs(dx) <= r + 1);
          break;
      }
      if (in) cv.put(x0 + dx, y0 + dy, c);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Line chart

void validate_line_chart(const LineChart& ch) {
  constexpr const char* fn = "save_line_chart";
  HL_CHECK(ch.width >= 200 && ch.width <= kMaxSide && ch.height >= 200 && ch.height <= kMaxSide, fn,
           ": size ", ch.width, " x ", ch.height, " is outside 200..", kMaxSide, " pixels");
  const std::string chart = ch.title.empty() ? "chart" : "chart '" + ch.title + "'";
  HL_CHECK(!ch.series.empty(), fn, ": ", chart, " has no series");
  bool any = false;
  for (size_t i = 0; i < ch.series.size(); ++i) {
    const Series& s = ch.series[i];
    std::string name = s.name.empty() ? "#" : "'";
    name += s.name.empty() ? std::to_string(i) : s.name + "'";
    HL_CHECK(!s.x.empty() || !s.y.empty(), fn, ": series ", name, " has no points");
    HL_CHECK(s.x.size() == s.y.size(), fn, ": series ", name, " has ", s.x.size(), " x values but ",
             s.y.size(), " y values");
    for (size_t k = 0; k < s.x.size(); ++k) {
      if (!std::isfinite(s.x[k]) || !std::isfinite(s.y[k])) continue;
      HL_CHECK(!ch.log_x || s.x[k] > 0, fn, ": log_x needs x > 0, but series ", name, " has x[", k,
               "] = ", s.x[k]);
      HL_CHECK(!ch.log_y || s.y[k] > 0, fn, ": log_y needs y > 0, but series ", name, " has y[", k,
               "] = ", s.y[k]);
      any = true;
    }
  }
  HL_CHECK(any, fn, ": ", chart, " has no finite (x, y) point to draw");
}

// Draws the chart; with the legend inside the plot unless legend_outside. Returns through
// `legend_clash` whether the best inside spot for the legend still covered data.
Canvas render_line_chart(const LineChart& ch, bool legend_outside, bool* legend_clash) {
  const int s = std::max(1, std::min(ch.width, ch.height) / 500);  // text and stroke scale
  const int ts = s, title_s = 2 * s;                               // tick text, title text
  const int pad = 10 * s, tick_len = 5 * s, line_w = 2 * s;
  Canvas cv(ch.width, ch.height, background_color());

  // Data ranges over finite points only.
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  for (const Series& sr : ch.series)
    for (size_t k = 0; k < sr.x.size(); ++k) {
      if (!std::isfinite(sr.x[k]) || !std::isfinite(sr.y[k])) continue;
      xlo = std::min(xlo, sr.x[k]);
      xhi = std::max(xhi, sr.x[k]);
      ylo = std::min(ylo, sr.y[k]);
      yhi = std::max(yhi, sr.y[k]);
    }
  if (ch.log_x) {  // log axes keep their range in log10 units
    xlo = std::log10(xlo);
    xhi = std::log10(xhi);
  }
  if (ch.log_y) {
    ylo = std::log10(ylo);
    yhi = std::log10(yhi);
  }
  widen(xlo, xhi);
  widen(ylo, yhi);
  HL_CHECK(std::isfinite(xhi - xlo) && std::isfinite(yhi - ylo),
           "save_line_chart: data range too large to draw");
  {  // 5% margins, like matplotlib, so end points do not sit on the frame
    const double mx = 0.05 * (xhi - xlo), my = 0.05 * (yhi - ylo);
    xlo -= mx;
    xhi += mx;
    ylo -= my;
    yhi += my;
  }

  // Legend block size (named series only).
  std::vector<size_t> named;
  for (size_t i = 0; i < ch.series.size(); ++i)
    if (!ch.series[i].name.empty()) named.push_back(i);
  const int marker_r = 3 * s + 1;
  const int entry_h = std::max(kLineH * ts, 2 * marker_r + 1) + 4 * s, swatch_w = 24 * s;
  int legend_w = 0, legend_h = 0;
  std::vector<std::string> legend_names;
  for (size_t i : named) {
    legend_names.push_back(fit_text(printable(ch.series[i].name), ts, ch.width / 3));
    legend_w = std::max(legend_w, text_width(legend_names.back(), ts));
  }
  if (!named.empty()) {
    legend_w += 3 * 6 * s + swatch_w;
    legend_h = 2 * 5 * s + static_cast<int>(named.size()) * entry_h - 4 * s;
  }

  // Vertical layout first: the y ticks decide the left margin's width.
  std::string title = printable(ch.title);
  int title_scale = title_s;
  if (text_width(title, title_scale) > ch.width - 2 * pad) title_scale = ts;
  title = fit_text(title, title_scale, ch.width - 2 * pad);
  const std::string xlab = fit_text(printable(ch.x_label), ts, ch.width - 2 * pad);
  const int top = 2 * pad + (title.empty() ? 0 : kCapH * title_scale);
  const int bottom =
      tick_len + 4 * s + kLineH * ts + (xlab.empty() ? 0 : 6 * s + kLineH * ts) + pad;
  const int py0 = top, py1 = ch.height - bottom;  // plot area rows [py0, py1)
  const int plot_h = py1 - py0;
  HL_CHECK(plot_h >= 40, "save_line_chart: ", ch.width, " x ", ch.height,
           " pixels leave no room for the plot; make the chart taller");
  const std::string ylab = fit_text(printable(ch.y_label), ts, plot_h);

  auto y_fits = [&](double gap_px, const std::vector<std::string>&) {
    return gap_px >= (kLineH + 4) * ts;
  };
  Ticks yt = ch.log_y ? log_ticks(ylo, yhi, plot_h, 40.0 * s, y_fits)
                      : linear_ticks(ylo, yhi, plot_h, 50.0 * s, y_fits);
  int ytick_w = 0;
  for (const auto& l : yt.labels) ytick_w = std::max(ytick_w, text_width(l, ts));
  const int left = pad + (ylab.empty() ? 0 : kLineH * ts + 8 * s) + ytick_w + 4 * s + tick_len;
  const int right = 2 * pad + (legend_outside ? legend_w + pad : 0);
  const int px0 = left, px1 = ch.width - right;
  const int plot_w = px1 - px0;
  HL_CHECK(plot_w >= 40, "save_line_chart: ", ch.width, " x ", ch.height,
           " pixels leave no room for the plot; make the chart wider");

  auto x_fits = [&](double gap_px, const std::vector<std::string>& labels) {
    int w = 0;
    for (const auto& l : labels) w = std::max(w, text_width(l, ts));
    return gap_px >= w + 12 * s;
  };
  const Ticks xt = ch.log_x ? log_ticks(xlo, xhi, plot_w, 60.0 * s, x_fits)
                            : linear_ticks(xlo, xhi, plot_w, 80.0 * s, x_fits);

  auto X = [&](double v) {
    if (ch.log_x) v = std::log10(v);
    return px0 + (v - xlo) / (xhi - xlo) * (plot_w - 1);
  };
  auto Y = [&](double v) {
    if (ch.log_y) v = std::log10(v);
    return py1 - 1 - (v - ylo) / (yhi - ylo) * (plot_h - 1);
  };

  // Grid behind the data.
  for (double v : xt.values)
    cv.fill_rect(static_cast<int>(std::lround(X(v))), py0, 1, plot_h, kGrid);
  for (double v : yt.values)
    cv.fill_rect(px0, static_cast<int>(std::lround(Y(v))), plot_w, 1, kGrid);

  // Data, clipped to the plot area; the snapshot lets the legend find an empty corner.
  const std::vector<uint8_t> before = cv.pixels();
  cv.set_clip(px0, py0, px1, py1);
  for (size_t i = 0; i < ch.series.size(); ++i) {
    const Series& sr = ch.series[i];
    const Rgb c = series_color(i);
    bool have_prev = false;
    double qx = 0, qy = 0;
    size_t finite = 0;
    for (size_t k = 0; k < sr.x.size(); ++k) {
      if (!std::isfinite(sr.x[k]) || !std::isfinite(sr.y[k])) {
        have_prev = false;  // a gap in the data is a gap in the line
        continue;
      }
      const double x = X(sr.x[k]), y = Y(sr.y[k]);
      if (have_prev) cv.line(qx, qy, x, y, c, line_w);
      qx = x;
      qy = y;
      have_prev = true;
      ++finite;
    }
    // Markers shrink when points crowd, so that the line stays visible between them, and are
    // left out when closer than ~5 px (a loss curve of 10k steps): they would only smear the line.
    const double spacing = finite > 1 ? plot_w / static_cast<double>(finite - 1) : plot_w;
    const int r = std::clamp(static_cast<int>(spacing / 3), 2 * s, marker_r);
    if (spacing < 5 * s) continue;
    for (size_t k = 0; k < sr.x.size(); ++k)
      if (std::isfinite(sr.x[k]) && std::isfinite(sr.y[k]))
        draw_marker(cv, X(sr.x[k]), Y(sr.y[k]), r, marker_of(i), c);
  }
  cv.reset_clip();

  // Axes frame, ticks and labels.
  cv.frame_rect(px0 - 1, py0 - 1, plot_w + 2, plot_h + 2, kInk);
  for (size_t k = 0; k < xt.values.size(); ++k) {
    const int x = static_cast<int>(std::lround(X(xt.values[k])));
    cv.fill_rect(x, py1 + 1, s, tick_len, kInk);
    draw_text(cv, xt.labels[k], x, py1 + 1 + tick_len + 4 * s, ts, kInk, Align::center,
              Align::start);
  }
  for (size_t k = 0; k < yt.values.size(); ++k) {
    const int y = static_cast<int>(std::lround(Y(yt.values[k])));
    cv.fill_rect(px0 - 1 - tick_len, y, tick_len, s, kInk);
    draw_text(cv, yt.labels[k], px0 - 1 - tick_len - 4 * s, y, ts, kInk, Align::end, Align::center);
  }
  if (!xlab.empty())
    draw_text(cv, xlab, px0 + plot_w / 2, py1 + 1 + tick_len + 4 * s + kLineH * ts + 6 * s, ts,
              kInk, Align::center, Align::start);
  if (!ylab.empty())
    draw_text(cv, ylab, pad, py0 + plot_h / 2, ts, kInk, Align::start, Align::center, true);
  if (!title.empty()) {
    const int tw = text_width(title, title_scale);
    const int cx = std::clamp(px0 + plot_w / 2, pad + tw / 2, ch.width - pad - tw / 2);
    draw_text(cv, title, cx, pad, title_scale, kInk, Align::center, Align::start);
  }

  // Legend: the inside spot covering the fewest data pixels; the caller moves it outside when
  // every spot covers some.
  if (legend_clash) *legend_clash = false;
  if (!named.empty()) {
    int lx = 0, ly = 0;
    if (legend_outside) {
      lx = px1 + pad;
      ly = py0;
    } else {
      const int in = 8 * s;
      const int xl = px0 + in, xr = px1 - in - legend_w, xm = px0 + (plot_w - legend_w) / 2;
      const int yt0 = py0 + in, yb = py1 - in - legend_h, ym = py0 + (plot_h - legend_h) / 2;
      const std::array<std::pair<int, int>, 8> spots = {
          {{xr, yt0}, {xl, yt0}, {xr, yb}, {xl, yb}, {xr, ym}, {xl, ym}, {xm, yt0}, {xm, yb}}};
      long best = -1;
      for (auto [sx, sy] : spots) {
        long covered = 0;
        for (int y = std::max(0, sy - 3); y < std::min(ch.height, sy + legend_h + 3); ++y)
          for (int x = std::max(0, sx - 3); x < std::min(ch.width, sx + legend_w + 3); ++x) {
            const size_t o = (static_cast<size_t>(y) * ch.width + x) * 3;
            covered += std::memcmp(&before[o], &cv.pixels()[o], 3) != 0;
          }
        if (best < 0 || covered < best) {
          best = covered;
          lx = sx;
          ly = sy;
        }
      }
      if (legend_clash) *legend_clash = best > 0;
    }
    cv.fill_rect(lx, ly, legend_w, legend_h, background_color());
    cv.frame_rect(lx, ly, legend_w, legend_h, kFrame);
    for (size_t e = 0; e < named.size(); ++e) {
      const size_t i = named[e];
      const int cy = ly + 5 * s + static_cast<int>(e) * entry_h + (entry_h - 4 * s) / 2;
      const int sx = lx + 6 * s;
      cv.line(sx, cy, sx + swatch_w - 1, cy, series_color(i), line_w);
      draw_marker(cv, sx + swatch_w / 2.0, cy + (line_w - 1) / 2.0, marker_r, marker_of(i),
                  series_color(i));
      draw_text(cv, legend_names[e], sx + swatch_w + 6 * s, cy + (line_w - 1) / 2, ts, kInk,
                Align::start, Align::center);
    }
  }
  return cv;
}

// ---------------------------------------------------------------------------------------------
// Heatmaps. A single heatmap is drawn as a 1 x 1 grid whose figure title is the map's title, so
// both pictures share one layout.

struct ColorRange {
  double lo, hi;
  Rgb at(double v) const { return viridis((v - lo) / (hi - lo)); }  // NaN stays NaN: grey
};

void validate_panel(const Heatmap& m, const std::string& who) {
  HL_CHECK(m.rows >= 1 && m.cols >= 1 && m.rows <= kMaxSide && m.cols <= kMaxSide, who,
           ": rows and cols must be in 1..", kMaxSide, ", got ", m.rows, " x ", m.cols);
  HL_CHECK(static_cast<int64_t>(m.values.size()) == m.rows * m.cols, who, ": ", m.values.size(),
           " values for a ", m.rows, " x ", m.cols, " heatmap (expected ", m.rows * m.cols, ")");
  HL_CHECK(m.row_labels.empty() || static_cast<int64_t>(m.row_labels.size()) == m.rows, who, ": ",
           m.row_labels.size(), " row labels for ", m.rows, " rows");
  HL_CHECK(m.col_labels.empty() || static_cast<int64_t>(m.col_labels.size()) == m.cols, who, ": ",
           m.col_labels.size(), " column labels for ", m.cols, " columns");
}

std::vector<std::string> axis_labels(const std::vector<std::string>& given, int64_t n) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(given.empty() ? std::to_string(i) : fit_text(printable(given[i]), 1, 150));
  return out;
}

// Text written in cells: two significant digits for the largest magnitude, the same decimals for
// all cells so that columns of numbers line up.
std::string cell_text(double v, double maxabs) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  if (maxabs == 0 || (maxabs >= 1e-3 && maxabs < 1e5)) {
    const int decimals =
        maxabs == 0 ? 0 : std::clamp(2 - static_cast<int>(std::ceil(std::log10(maxabs))), 0, 4);
    std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
    if (buf[0] == '-' && std::string(buf).find_first_not_of("-0.") == std::string::npos)
      return buf + 1;  // "-0.00" reads as a sign error
  } else {
    std::snprintf(buf, sizeof(buf), "%.1e", v);
    return tidy_exponent(buf);
  }
  return buf;
}

struct GridSpec {
  const char* fn;
  std::string title, x_label, y_label, cbar_label;
  int64_t grid_rows, grid_cols;
  std::vector<const Heatmap*> panels;
  std::vector<std::string> panel_titles;
  ColorRange range;
  int matrix_budget_w, matrix_budget_h, max_cell;  // pixels for all matrices side by side
};

struct PanelLayout {
  std::vector<std::string> row_text, col_text, cell_text, title;
  bool show_rows = false, show_cols = false, rotate_cols = false, annotate = false;
  int row_every = 1, col_every = 1;
  int title_h = 0, left_w = 0, mat_w = 0, mat_h = 0, bottom_h = 0, title_w = 0;
};

Canvas render_grid(const GridSpec& g) {
  const int pad = 12, gap = 4, tick = 3, hgap = 18, vgap = 20;
  const int ts = 1;
  const int64_t n = static_cast<int64_t>(g.panels.size());

  // Panels share row (column) labels when all have the same rows and labels: write them once.
  bool shared_rows = true, shared_cols = true;
  for (const Heatmap* p : g.panels) {
    shared_rows = shared_rows && p->rows == g.panels[0]->rows &&
                  p->row_labels == g.panels[0]->row_labels && p->y_label == g.panels[0]->y_label;
    shared_cols = shared_cols && p->cols == g.panels[0]->cols &&
                  p->col_labels == g.panels[0]->col_labels && p->x_label == g.panels[0]->x_label;
  }

  // One cell size for all panels: within the pixel budget, capped so tiny maps stay tidy.
  int64_t max_r = 1, max_c = 1;
  for (const Heatmap* p : g.panels) {
    max_r = std::max(max_r, p->rows);
    max_c = std::max(max_c, p->cols);
  }
  int cs = static_cast<int>(std::min<int64_t>(g.matrix_budget_w / (g.grid_cols * max_c),
                                              g.matrix_budget_h / (g.grid_rows * max_r)));
  cs = std::clamp(cs, 1, g.max_cell);

  // Annotations: grow cells to fit the text when that keeps within twice the budget.
  std::vector<std::vector<std::string>> texts(n);
  int need = 0;
  bool any_annotate = false;
  for (int64_t i = 0; i < n; ++i) {
    const Heatmap& p = *g.panels[i];
    if (!p.annotate) continue;
    any_annotate = true;
    double maxabs = 0;
    for (double v : p.values)
      if (std::isfinite(v)) maxabs = std::max(maxabs, std::abs(v));
    for (double v : p.values) {
      texts[i].push_back(cell_text(v, maxabs));
      need = std::max(need, text_width(texts[i].back(), ts) + 6);
    }
  }
  need = std::max(need, kLineH + 4);
  if (any_annotate && need > cs && need * g.grid_cols * max_c <= 2 * g.matrix_budget_w &&
      need * g.grid_rows * max_r <= 2 * g.matrix_budget_h)
    cs = std::min(need, 96);

  // Panel titles grow with the panels; the figure title stays one size above them.
  const int panel_title_s = max_c * cs >= 300 ? 2 : 1;
  bool any_panel_title = false;
  for (const std::string& t : g.panel_titles) any_panel_title = any_panel_title || !t.empty();
  const int fig_title_s = any_panel_title ? panel_title_s + 1 : 2;
  const int fls = any_panel_title ? panel_title_s : 1;  // figure axis and colour-bar labels

  std::vector<PanelLayout> lay(n);
  for (int64_t i = 0; i < n; ++i) {
    const Heatmap& p = *g.panels[i];
    PanelLayout& L = lay[i];
    const int64_t gr = i / g.grid_cols, gc = i % g.grid_cols;
    L.show_rows = !shared_rows || gc == 0;
    L.show_cols = !shared_cols || (gr + 1) * g.grid_cols + gc >= n;  // nothing below this panel
    L.row_text = axis_labels(p.row_labels, p.rows);
    L.col_text = axis_labels(p.col_labels, p.cols);
    L.mat_w = static_cast<int>(p.cols) * cs;
    L.mat_h = static_cast<int>(p.rows) * cs;
    L.annotate = p.annotate && need <= cs;
    if (L.annotate) L.cell_text = texts[i];
    const std::string t = printable(g.panel_titles[i]);
    if (!t.empty()) {
      L.title.push_back(t);
      L.title_w = text_width(t, panel_title_s);
      L.title_h = kCapH * panel_title_s + 4 * panel_title_s + 2;
    }
    int row_w = 0, col_w = 0;
    for (const auto& s : L.row_text) row_w = std::max(row_w, text_width(s, ts));
    for (const auto& s : L.col_text) col_w = std::max(col_w, text_width(s, ts));
    // Labels are thinned to every k-th when cells are smaller than a line of text.
    L.row_every = std::max(1, (kLineH + 2 + cs - 1) / cs);
    L.rotate_cols = col_w + 4 > cs;
    L.col_every = std::max(1, ((L.rotate_cols ? kLineH + 2 : col_w + 4) + cs - 1) / cs);
    const std::string ylab = printable(p.y_label), xlab = printable(p.x_label);
    L.left_w = (L.show_rows ? row_w + tick + gap : 0) +
               (L.show_rows && !ylab.empty() ? kLineH + 2 * gap : 0);
    L.bottom_h = (L.show_cols ? tick + gap + (L.rotate_cols ? col_w : kCapH) : 0) +
                 (L.show_cols && !xlab.empty() ? kLineH + 2 * gap : 0);
  }

  // Column widths and row heights of the panel grid; panels align on their matrices.
  std::vector<int> left_w(g.grid_cols, 0), mat_w(g.grid_cols, 0), extra_left(g.grid_cols, 0),
      slot_w(g.grid_cols, 0);
  std::vector<int> title_h(g.grid_rows, 0), mat_h(g.grid_rows, 0), bottom_h(g.grid_rows, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t gr = i / g.grid_cols, gc = i % g.grid_cols;
    left_w[gc] = std::max(left_w[gc], lay[i].left_w);
    mat_w[gc] = std::max(mat_w[gc], lay[i].mat_w);
    title_h[gr] = std::max(title_h[gr], lay[i].title_h);
    mat_h[gr] = std::max(mat_h[gr], lay[i].mat_h);
    bottom_h[gr] = std::max(bottom_h[gr], lay[i].bottom_h);
  }
  for (int64_t i = 0; i < n; ++i) {  // a title wider than its matrix widens the slot both ways
    const int64_t gc = i % g.grid_cols;
    const int half = lay[i].title_w / 2 + 1;
    extra_left[gc] = std::max(extra_left[gc], half - (left_w[gc] + lay[i].mat_w / 2));
  }
  for (int64_t c = 0; c < g.grid_cols; ++c) {
    slot_w[c] = extra_left[c] + left_w[c] + mat_w[c];
    for (int64_t i = c; i < n; i += g.grid_cols)
      slot_w[c] = std::max(slot_w[c],
                           extra_left[c] + left_w[c] + lay[i].mat_w / 2 + lay[i].title_w / 2 + 1);
  }

  const std::string title = printable(g.title), xlab = printable(g.x_label),
                    ylab = printable(g.y_label);
  const std::string cbar_label = printable(g.cbar_label);
  const int fig_title_h = title.empty() ? 0 : kCapH * fig_title_s + pad + 4;
  const int fig_ylab_w = ylab.empty() ? 0 : kLineH * fls + pad;

  int64_t x = pad + fig_ylab_w;
  std::vector<int64_t> slot_x(g.grid_cols), slot_y(g.grid_rows);
  for (int64_t c = 0; c < g.grid_cols; ++c) {
    slot_x[c] = x;
    x += slot_w[c] + (c + 1 < g.grid_cols ? hgap : 0);
  }
  const int64_t panels_right = x;
  int64_t y = pad + fig_title_h;
  for (int64_t r = 0; r < g.grid_rows; ++r) {
    slot_y[r] = y;
    y += title_h[r] + mat_h[r] + bottom_h[r] + (r + 1 < g.grid_rows ? vgap : 0);
  }
  const int64_t panels_bottom = y;

  // Colour bar beside the panels, spanning the matrices, but never shorter than 150 px.
  const int64_t bar_top = slot_y[0] + title_h[0];
  const int64_t mats_bottom =
      slot_y[g.grid_rows - 1] + title_h[g.grid_rows - 1] + mat_h[g.grid_rows - 1];
  const int bar_h = static_cast<int>(std::max<int64_t>(150, mats_bottom - bar_top));
  const int bar_w = 16;
  const int64_t bar_x = panels_right + 20;
  const double lo = g.range.lo, hi = g.range.hi;
  Ticks bt = linear_ticks(
      lo, hi, bar_h, std::max(40.0, bar_h / 10.0),
      [&](double gap_px, const std::vector<std::string>&) { return gap_px >= kLineH + 4; });
  int bar_label_w = 0;
  for (const auto& l : bt.labels) bar_label_w = std::max(bar_label_w, text_width(l, ts));
  const std::string cbl = fit_text(cbar_label, fls, bar_h);
  const int64_t content_right =
      bar_x + bar_w + tick + gap + bar_label_w + (cbl.empty() ? 0 : pad + kLineH * fls);
  const int64_t content_bottom =
      std::max(panels_bottom, bar_top + bar_h) + (xlab.empty() ? 0 : pad + kLineH * fls);

  int64_t width = content_right + pad, height = content_bottom + pad;
  const int title_w = text_width(title, fig_title_s);
  int64_t shift = 0;  // a title wider than the content centres the content under it
  if (title_w + 2 * pad > width) {
    shift = (title_w + 2 * pad - width) / 2;
    width = title_w + 2 * pad;
  }
  check_size(g.fn, "the picture", width, height);
  Canvas cv(static_cast<int>(width), static_cast<int>(height), background_color());
  const int sx = static_cast<int>(shift);

  for (int64_t i = 0; i < n; ++i) {
    const Heatmap& p = *g.panels[i];
    const PanelLayout& L = lay[i];
    const int64_t gr = i / g.grid_cols, gc = i % g.grid_cols;
    const int mx = static_cast<int>(slot_x[gc] + extra_left[gc] + left_w[gc]) + sx;
    const int my = static_cast<int>(slot_y[gr] + title_h[gr]);
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t c = 0; c < p.cols; ++c) {
        const double v = p.values[r * p.cols + c];
        const Rgb col = g.range.at(v);
        const int cx = mx + static_cast<int>(c) * cs, cy = my + static_cast<int>(r) * cs;
        cv.fill_rect(cx, cy, cs, cs, col);
        if (L.annotate) {
          const int lum = (299 * col.r + 587 * col.g + 114 * col.b) / 1000;
          draw_text(cv, L.cell_text[r * p.cols + c], cx + cs / 2, cy + cs / 2, ts,
                    lum > 128 ? Rgb{0, 0, 0} : Rgb{255, 255, 255}, Align::center, Align::center);
        }
      }
    if (!L.title.empty())
      draw_text(cv, L.title[0], mx + L.mat_w / 2, my - L.title_h, panel_title_s, kInk,
                Align::center, Align::start);
    if (L.show_rows) {
      for (int64_t r = 0; r < p.rows; r += L.row_every) {
        const int cy = my + static_cast<int>(r) * cs + cs / 2;
        cv.fill_rect(mx - tick, cy, tick, 1, kInk);
        draw_text(cv, L.row_text[r], mx - tick - gap, cy + 1, ts, kInk, Align::end, Align::center);
      }
      const std::string yl = fit_text(printable(p.y_label), ts, std::max(L.mat_h, 0));
      if (!yl.empty())
        draw_text(cv, yl, mx - L.left_w + gap, my + L.mat_h / 2, ts, kInk, Align::start,
                  Align::center, true);
    }
    if (L.show_cols) {
      int label_h = 0;
      for (int64_t c = 0; c < p.cols; c += L.col_every) {
        const int cx = mx + static_cast<int>(c) * cs + cs / 2;
        cv.fill_rect(cx, my + L.mat_h, 1, tick, kInk);
        const int ty = my + L.mat_h + tick + gap;
        if (L.rotate_cols) {
          draw_text(cv, L.col_text[c], cx - (kCapH - 1) / 2, ty, ts, kInk, Align::start,
                    Align::start, true);
          label_h = std::max(label_h, text_width(L.col_text[c], ts));
        } else {
          draw_text(cv, L.col_text[c], cx + 1, ty, ts, kInk, Align::center, Align::start);
          label_h = kCapH;
        }
      }
      const std::string xl = fit_text(printable(p.x_label), ts, std::max(L.mat_w, 60));
      if (!xl.empty())
        draw_text(cv, xl, mx + L.mat_w / 2, my + L.mat_h + tick + gap + label_h + 2 * gap, ts, kInk,
                  Align::center, Align::start);
    }
  }

  // Colour bar: top row is exactly the top colour, bottom row the bottom colour.
  const int bx = static_cast<int>(bar_x) + sx, by = static_cast<int>(bar_top);
  for (int j = 0; j < bar_h; ++j)
    cv.fill_rect(bx, by + j, bar_w, 1,
                 viridis(1.0 - static_cast<double>(j) / std::max(1, bar_h - 1)));
  cv.frame_rect(bx - 1, by - 1, bar_w + 2, bar_h + 2, kInk);
  for (size_t k = 0; k < bt.values.size(); ++k) {
    const int ty =
        by + static_cast<int>(std::lround((hi - bt.values[k]) / (hi - lo) * (bar_h - 1)));
    cv.fill_rect(bx + bar_w + 1, ty, tick, 1, kInk);
    draw_text(cv, bt.labels[k], bx + bar_w + 1 + tick + gap, ty, ts, kInk, Align::start,
              Align::center);
  }
  if (!cbl.empty())
    draw_text(cv, cbl, bx + bar_w + 1 + tick + gap + bar_label_w + pad, by + bar_h / 2, fls, kInk,
              Align::start, Align::center, true);

  // Figure labels and title.
  const int panels_x0 = static_cast<int>(slot_x[0]) + sx,
            panels_x1 = static_cast<int>(panels_right) + sx;
  if (!title.empty())
    draw_text(cv, title, static_cast<int>(width) / 2, pad, fig_title_s, kInk, Align::center,
              Align::start);
  if (!xlab.empty())
    draw_text(cv, fit_text(xlab, fls, static_cast<int>(width) - 2 * pad),
              (panels_x0 + panels_x1) / 2, static_cast<int>(panels_bottom) + pad, fls, kInk,
              Align::center, Align::start);
  if (!ylab.empty())
    draw_text(cv, fit_text(ylab, fls, static_cast<int>(panels_bottom - slot_y[0])), pad + sx,
              static_cast<int>((slot_y[0] + panels_bottom) / 2), fls, kInk, Align::start,
              Align::center, true);
  return cv;
}

}  // namespace

void save_line_chart(const LineChart& chart, const std::string& png_path) {
  validate_line_chart(chart);
  bool clash = false;
  Canvas cv = render_line_chart(chart, false, &clash);
  if (clash) cv = render_line_chart(chart, true, nullptr);  // no free corner: legend goes outside
  write_png(cv, png_path, "save_line_chart");
}

void save_heatmap(const Heatmap& map, const std::string& png_path) {
  constexpr const char* fn = "save_heatmap";
  validate_panel(map, fn);
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : map.values)
    if (std::isfinite(v)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (!std::isfinite(lo)) {  // nothing finite: any range will do, every cell is grey
    lo = 0;
    hi = 1;
  }
  HL_CHECK(!map.vmin || std::isfinite(*map.vmin), fn, ": vmin must be finite, got ", *map.vmin);
  HL_CHECK(!map.vmax || std::isfinite(*map.vmax), fn, ": vmax must be finite, got ", *map.vmax);
  if (map.vmin && map.vmax)
    HL_CHECK(*map.vmin < *map.vmax, fn, ": vmin (", *map.vmin, ") must be less than vmax (",
             *map.vmax, ")");
  lo = map.vmin.value_or(lo);
  hi = map.vmax.value_or(hi);
  if (!(hi > lo) &&
      map.vmin.has_value() != map.vmax.has_value()) {  // one bound beyond the data: keep it
    if (map.vmin)
      hi = lo + (lo == 0 ? 1.0 : std::abs(lo) * 0.1);
    else
      lo = hi - (hi == 0 ? 1.0 : std::abs(hi) * 0.1);
  }
  widen(lo, hi);  // all values equal (or a vanishing span): they take the middle colour
  HL_CHECK(std::isfinite(hi - lo), fn, ": value range too large to draw");

  // The map's title becomes the figure's (larger) title; its axis labels stay with the panel.
  GridSpec g{fn, map.title, "", "", map.colorbar_label, 1, 1, {&map}, {""}, {lo, hi}, 640, 480, 64};
  write_png(render_grid(g), png_path, fn);
}

void save_heatmap_grid(const HeatmapGrid& grid, const std::string& png_path) {
  constexpr const char* fn = "save_heatmap_grid";
  HL_CHECK(
      grid.grid_rows >= 1 && grid.grid_cols >= 1 && grid.grid_rows <= 256 && grid.grid_cols <= 256,
      fn, ": grid must be 1..256 x 1..256 panels, got ", grid.grid_rows, " x ", grid.grid_cols);
  HL_CHECK(!grid.panels.empty(), fn, ": no panels");
  HL_CHECK(static_cast<int64_t>(grid.panels.size()) <= grid.grid_rows * grid.grid_cols, fn, ": ",
           grid.panels.size(), " panels do not fit a ", grid.grid_rows, " x ", grid.grid_cols,
           " grid");
  HL_CHECK(std::isfinite(grid.vmin) && std::isfinite(grid.vmax) && grid.vmin < grid.vmax, fn,
           ": need finite vmin < vmax, got [", grid.vmin, ", ", grid.vmax, "]");
  HL_CHECK(std::isfinite(grid.vmax - grid.vmin), fn, ": value range too large to draw");
  GridSpec g{fn,
             grid.title,
             grid.x_label,
             grid.y_label,
             grid.colorbar_label,
             0,
             grid.grid_cols,
             {},
             {},
             {grid.vmin, grid.vmax},
             3000,
             2400,
             48};
  for (size_t i = 0; i < grid.panels.size(); ++i) {
    validate_panel(grid.panels[i],
                   std::string(fn) + ": panel " + std::to_string(i) +
                       (grid.panels[i].title.empty() ? "" : " ('" + grid.panels[i].title + "')"));
    g.panels.push_back(&grid.panels[i]);
    g.panel_titles.push_back(grid.panels[i].title);
  }
  // Rows left wholly empty by a short panel list are not drawn.
  g.grid_rows = (static_cast<int64_t>(grid.panels.size()) + grid.grid_cols - 1) / grid.grid_cols;
  write_png(render_grid(g), png_path, fn);
}

}  // namespace headlab::plot
