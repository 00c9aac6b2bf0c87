// Graph pictures through Graphviz: a graph in the DOT language laid out and rendered by Graphviz's `dot`
// program to PNG or SVG, returned in memory so that the caller writes the file atomically. `dot` runs in
// its own process: Debian 12's Graphviz 2.42 reads freed memory in its text layout (AddressSanitizer
// reports it in any process that lays out a label through libgvc), which must not happen inside ours.
#pragma once
#include <string>

namespace headlab::plot {

// The picture's bytes; format "png" or "svg". Throws naming `who` when `dot` is missing, refuses the
// graph (with its message) or writes nothing.
std::string render_dot(const std::string& dot, const std::string& format, const std::string& who);
// Throws as render_dot would when `dot` cannot run: for a command to check before its first result.
void check_graphviz(const std::string& who);

}  // namespace headlab::plot
