// render_dot: the DOT text into a private temporary folder, `dot -T<format>` spawned on it (no shell),
// its output and messages read back, the folder removed.
#include "plot/graph.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "base/error.h"

extern char** environ;

namespace headlab::plot {

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Removes the folder and what is in it when the scope ends.
struct TempFolder {
  std::string path;
  ~TempFolder() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

std::string render_dot(const std::string& dot, const std::string& format, const std::string& who) {
  HL_CHECK(format == "png" || format == "svg", who, ": a graph picture is png or svg, not '", format, "'");
  std::string pattern = (std::filesystem::temp_directory_path() / "headlab-dot-XXXXXX").string();
  HL_CHECK(::mkdtemp(pattern.data()) != nullptr, who,
           ": cannot make a temporary folder for Graphviz: ", std::strerror(errno));
  const TempFolder folder{pattern};
  const std::string in = folder.path + "/graph.dot", out = folder.path + "/graph." + format,
                    messages = folder.path + "/messages.txt";
  {
    std::ofstream f(in, std::ios::binary);
    f << dot;
    HL_CHECK(f.good(), who, ": cannot write '", in, "' for Graphviz");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, messages.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  const std::string type = "-T" + format;
  std::vector<char*> argv{const_cast<char*>("dot"), const_cast<char*>(type.c_str()), const_cast<char*>(in.c_str()),
                          const_cast<char*>("-o"),  const_cast<char*>(out.c_str()),  nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "dot", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  HL_CHECK(spawned == 0, who, ": cannot run Graphviz's dot (", std::strerror(spawned),
           "); install graphviz (scripts/install-deps.sh does)");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  HL_CHECK(ok, who, ": Graphviz's dot failed (", WIFEXITED(status) ? "exit " : "signal ",
           WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), "): ", read_all(messages).substr(0, 500));
  std::string picture = read_all(out);
  HL_CHECK(!picture.empty(), who, ": Graphviz's dot wrote no ", format, " picture");
  return picture;
}

void check_graphviz(const std::string& who) { (void)render_dot("digraph {}\n", "svg", who); }

}  // namespace headlab::plot
