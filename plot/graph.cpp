// render_dot through libgvc: agmemread parses, gvLayout runs dot, gvRenderData renders into a buffer.
#include "plot/graph.h"

#include <graphviz/cgraph.h>
#include <graphviz/gvc.h>

#include <memory>
#include <mutex>

#include "base/error.h"

namespace headlab::plot {

std::string render_dot(const std::string& dot, const std::string& format, const std::string& who) {
  HL_CHECK(format == "png" || format == "svg", who, ": a graph picture is png or svg, not '", format, "'");
  static std::mutex mutex;  // Graphviz keeps global state (its error buffer, the parser)
  const std::lock_guard<std::mutex> lock(mutex);
  agseterr(AGMAX);  // errors come back through aglasterr, not printed
  const std::unique_ptr<GVC_t, int (*)(GVC_t*)> gvc(gvContext(), gvFreeContext);
  HL_CHECK(gvc, who, ": Graphviz could not start (gvContext)");
  const std::unique_ptr<Agraph_t, int (*)(Agraph_t*)> graph(agmemread(dot.c_str()), agclose);
  if (!graph) {
    const char* err = aglasterr();
    HL_FAIL(who, ": Graphviz cannot read the graph: ", err ? err : "(no message)");
  }
  HL_CHECK(gvLayout(gvc.get(), graph.get(), "dot") == 0, who, ": Graphviz's dot layout failed");
  char* data = nullptr;
  unsigned int length = 0;
  const int rc = gvRenderData(gvc.get(), graph.get(), format.c_str(), &data, &length);
  std::string out = rc == 0 && data ? std::string(data, length) : std::string();
  if (data) gvFreeRenderData(data);
  gvFreeLayout(gvc.get(), graph.get());
  HL_CHECK(rc == 0 && !out.empty(), who, ": Graphviz could not render ", format,
           " (is the Graphviz plugin for it installed? scripts/install-deps.sh installs graphviz)");
  return out;
}

}  // namespace headlab::plot
