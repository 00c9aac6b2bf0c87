// The Table renderers (table.h): aligned text, markdown, CSV.
#include "analysis/table.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "base/error.h"

namespace headlab::analysis {

void Table::add_row(std::vector<Cell> cells) {
  HL_CHECK(cells.size() == columns.size(), "Table '", title, "': expected ", columns.size(), " cells in a row, got ",
           cells.size());
  rows.push_back(std::move(cells));
}

namespace {

bool is_text(const Cell& c) { return std::holds_alternative<std::string>(c); }

// A column is aligned as text when its first cell is text.
bool text_aligned(const Table& t, size_t c) { return !t.rows.empty() && is_text(t.rows.front()[c]); }

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return out + "\"";
}

std::string csv_number(double v, NumberFormat f) {
  if (std::isnan(v)) return "nan";
  std::ostringstream os;
  if (f == NumberFormat::integer)
    os << std::llround(v);
  else
    os << std::setprecision(10) << v;
  return os.str();
}

}  // namespace

std::string format_cell(const Cell& cell, const Column& column) {
  if (is_text(cell)) return std::get<std::string>(cell);
  const double v = std::get<double>(cell);
  if (std::isnan(v)) return "nan";
  std::ostringstream os;
  switch (column.format) {
    case NumberFormat::fixed:
      os << std::fixed << std::setprecision(column.precision) << v;
      break;
    case NumberFormat::signed_fixed:
      os << std::showpos << std::fixed << std::setprecision(column.precision) << v;
      break;
    case NumberFormat::scientific:
      os << std::scientific << std::setprecision(column.precision) << v;
      break;
    case NumberFormat::integer:
      os << std::llround(v);
      break;
  }
  return os.str();
}

std::string fmt(double v, int precision) { return format_cell(v, {"", NumberFormat::fixed, precision}); }
std::string fmt_signed(double v, int precision) { return format_cell(v, {"", NumberFormat::signed_fixed, precision}); }
std::string count_of(int64_t n, const std::string& singular, const std::string& plural) {
  return std::to_string(n).append(" ").append(n == 1 ? singular : plural);
}
std::string fmt_sci(double v, int precision) { return format_cell(v, {"", NumberFormat::scientific, precision}); }

std::string render_text(const Table& t, int indent) {
  const size_t n = t.columns.size();
  std::vector<std::vector<std::string>> shown;
  std::vector<size_t> width(n);
  for (size_t c = 0; c < n; ++c) width[c] = t.columns[c].name.size();
  for (const auto& row : t.rows) {
    auto& s = shown.emplace_back();
    for (size_t c = 0; c < n; ++c) {
      s.push_back(format_cell(row[c], t.columns[c]));
      width[c] = std::max(width[c], s.back().size());
    }
  }
  const std::string lead(static_cast<size_t>(std::max(indent, 0)), ' ');
  std::ostringstream os;
  if (!t.title.empty()) os << t.title << "\n";
  auto line = [&](auto cell) {
    std::string l = lead;
    for (size_t c = 0; c < n; ++c) {
      const std::string s = cell(c);
      const std::string fill(width[c] - s.size(), ' ');
      if (c) l += "  ";
      l += text_aligned(t, c) ? s + (c + 1 < n ? fill : "") : fill + s;
    }
    l.erase(l.find_last_not_of(' ') + 1);  // an empty last cell leaves no trailing blanks
    os << l << "\n";
  };
  line([&](size_t c) { return t.columns[c].name; });
  for (const auto& s : shown) line([&](size_t c) { return s[c]; });
  return os.str();
}

std::string render_markdown(const Table& t) {
  auto escaped = [](const std::string& s) {
    std::string out;
    for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch == '\n' ? ' ' : ch);
    return out;
  };
  std::ostringstream os;
  os << "|";
  for (const Column& c : t.columns) os << " " << escaped(c.name) << " |";
  os << "\n|";
  for (size_t c = 0; c < t.columns.size(); ++c) os << "---|";
  os << "\n";
  for (const auto& row : t.rows) {
    os << "|";
    for (size_t c = 0; c < t.columns.size(); ++c) os << " " << escaped(format_cell(row[c], t.columns[c])) << " |";
    os << "\n";
  }
  return os.str();
}

std::string render_csv(const Table& t) {
  std::ostringstream os;
  for (size_t c = 0; c < t.columns.size(); ++c) os << (c ? "," : "") << csv_field(t.columns[c].name);
  os << "\n";
  for (const auto& row : t.rows) {
    for (size_t c = 0; c < t.columns.size(); ++c) {
      os << (c ? "," : "");
      os << (is_text(row[c]) ? csv_field(std::get<std::string>(row[c]))
                             : csv_number(std::get<double>(row[c]), t.columns[c].format));
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace headlab::analysis
