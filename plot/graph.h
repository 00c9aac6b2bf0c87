// Graph pictures through Graphviz's library (libgvc): a graph in the DOT language laid out by `dot`
// and rendered to PNG or SVG in memory, so that the caller writes the file atomically.
#pragma once
#include <string>

namespace headlab::plot {

// The picture's bytes; format "png" or "svg". Throws naming `who` when the DOT text does not parse or
// Graphviz cannot lay out or render it.
std::string render_dot(const std::string& dot, const std::string& format, const std::string& who);

}  // namespace headlab::plot
