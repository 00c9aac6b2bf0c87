// A result table as data: a title, named columns with a number format, rows of cells. One renderer
// per output (aligned terminal text, markdown, CSV), so a table printed to the terminal and written
// to report.md or a CSV file is built once and cannot drift between them.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

namespace headlab::analysis {

// How a column shows its numbers: fixed "0.1235", signed "+0.1235", scientific "1.24e-03",
// integer "12". Text cells are shown as they are in any column.
enum class NumberFormat { fixed, signed_fixed, scientific, integer };

struct Column {
  std::string name;
  NumberFormat format = NumberFormat::fixed;
  int precision = 4;  // digits after the point (fixed, signed) or of the mantissa (scientific)
};

// What a long analysis hands its caller as it goes: text for the terminal (a command prints it; the Python
// module and tests pass none).
using Say = std::function<void(const std::string& text)>;

// A number (shown by its column's format; NaN as "nan") or text.
using Cell = std::variant<double, std::string>;

struct Table {
  std::string title;  // the terminal's heading line; markdown and CSV leave it to the document
  std::vector<Column> columns;
  std::vector<std::vector<Cell>> rows;

  Table() = default;
  Table(std::string title, std::vector<Column> columns) : title(std::move(title)), columns(std::move(columns)) {}
  // Throws unless the row has one cell per column.
  void add_row(std::vector<Cell> cells);
};

// A column of text cells (the format is not used), and of numbers in each format.
inline Column text_column(std::string name) { return {std::move(name), NumberFormat::fixed, 0}; }
inline Column fixed_column(std::string name, int precision = 4) {
  return {std::move(name), NumberFormat::fixed, precision};
}
inline Column signed_column(std::string name, int precision = 4) {
  return {std::move(name), NumberFormat::signed_fixed, precision};
}
inline Column integer_column(std::string name) { return {std::move(name), NumberFormat::integer, 0}; }

// The cell as a column shows it.
std::string format_cell(const Cell& cell, const Column& column);

// Numbers as the tables show them: fixed "0.1235" (precision digits after the point), signed
// "+0.1235", scientific "1.2e-03"; NaN as "nan".
std::string fmt(double v, int precision = 4);
std::string fmt_signed(double v, int precision = 4);
// "1 validation batch", "2 validation batches": n and the noun that agrees with it.
std::string count_of(int64_t n, const std::string& singular, const std::string& plural);
std::string fmt_sci(double v, int precision = 1);

// The title (if any), then the header and the rows with each column padded to its widest cell: text
// columns aligned left, number columns right. Every line starts with `indent` spaces.
std::string render_text(const Table& t, int indent = 2);
// "| a | b |", "|---|---|", a line per row; '|' inside a cell escaped.
std::string render_markdown(const Table& t);
// A header of column names, a line per row. Numbers at full precision (10 significant digits, integer
// columns as integers, NaN as "nan"); a field with a comma, quote or line break is quoted, quotes doubled.
std::string render_csv(const Table& t);

}  // namespace headlab::analysis
