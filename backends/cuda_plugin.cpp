// The core's side of the CUDA plugin: finds libheadlab_cuda.so on first use of a CUDA device, loads it
// with dlopen and forwards backends/cuda/cuda_backend.h's functions to its table (backends/cuda/
// cuda_plugin.h), so that a process that never asks for a GPU never loads cudart or cuBLAS.
#ifdef HEADLAB_HAS_CUDA
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_plugin.h"

#ifndef HEADLAB_CUDA_PLUGIN_LIBDIR  // the install libdir, from CMake's GNUInstallDirs
#define HEADLAB_CUDA_PLUGIN_LIBDIR "/usr/local/lib"
#endif

namespace headlab {
namespace {

// The folder of the program or shared library that holds this code: the build puts the plugin
// beside build/headlab. The main program's link map has no name (dladdr would answer argv[0],
// which may be relative or a bare name found on PATH), so it is asked through /proc/self/exe.
std::string own_folder() {
  std::string file;
  Dl_info info{};
  link_map* map = nullptr;
  if (dladdr1(reinterpret_cast<void*>(&own_folder), &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) != 0 &&
      map != nullptr && map->l_name != nullptr && map->l_name[0] != '\0') {
    file = map->l_name;
  } else {
    char buf[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf);
    if (n > 0 && static_cast<size_t>(n) < sizeof buf) file.assign(buf, static_cast<size_t>(n));
  }
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? std::string() : file.substr(0, slash);
}

// Where to look, in order: HEADLAB_CUDA_PLUGIN when set (then nowhere else: an override that
// quietly fell back to another copy would hide its own mistake), beside this program or library,
// then the install libdir.
std::vector<std::string> plugin_candidates() {
  if (const char* path = std::getenv("HEADLAB_CUDA_PLUGIN"); path != nullptr && *path != '\0') return {path};
  std::vector<std::string> out;
  if (const std::string dir = own_folder(); !dir.empty()) out.push_back(dir + "/" + kCudaPluginFile);
  const std::string installed = std::string(HEADLAB_CUDA_PLUGIN_LIBDIR) + "/" + kCudaPluginFile;
  if (out.empty() || out.front() != installed) out.push_back(installed);
  return out;
}

const CudaHost kHost = [] {
  CudaHost h;
  h.out_of_memory_message = &out_of_memory_message;
  h.format_bytes = &format_bytes;
  return h;
}();

// The plugin's table, or why there is none ("<file> (<reason>), <file> (<reason>)").
struct Loaded {
  const CudaPlugin* table = nullptr;
  std::string why_not;
};

// Asks an entry point for its table; "" when it is usable, else the reason.
std::string take_table(CudaPluginEntry entry, Loaded& out) {
  const CudaPlugin* table = entry(&kHost);
  if (table == nullptr) return "its entry point returned no table";
  if (table->abi != kCudaPluginAbi)
    return detail::str_cat("plugin interface version ", table->abi, ", this headlab needs ", kCudaPluginAbi,
                           " (a libheadlab_cuda.so of another build)");
  out.table = table;
  return "";
}

Loaded load_plugin() {
  Loaded out;
  // A program linked with the plugin (the CUDA test suites, the benchmarks) holds it already.
  if (auto entry = reinterpret_cast<CudaPluginEntry>(::dlsym(RTLD_DEFAULT, kCudaPluginEntry))) {
    const std::string why = take_table(entry, out);
    if (out.table) return out;
    out.why_not = std::string("the linked-in plugin (") + why + "), ";
  }
  (void)::dlerror();  // the lookup above leaves "undefined symbol" behind when nothing is linked in
  for (const std::string& path : plugin_candidates()) {
    std::string why;
    if (void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      if (auto entry = reinterpret_cast<CudaPluginEntry>(::dlsym(lib, kCudaPluginEntry)))
        why = take_table(entry, out);
      else
        why = std::string("no ") + kCudaPluginEntry + " in it";
      if (out.table) return out;  // stays loaded for the life of the process
      ::dlclose(lib);
    } else {
      const char* err = ::dlerror();
      why = err ? err : "dlopen failed";
      if (why.rfind(path + ": ", 0) == 0) why.erase(0, path.size() + 2);  // dlerror repeats the file name
    }
    out.why_not += path + " (" + why + "), ";
  }
  out.why_not.resize(out.why_not.size() - 2);
  return out;
}

// Loaded once per process (a failure too: the same error every time).
const Loaded& plugin() {
  static const Loaded loaded = load_plugin();
  return loaded;
}

const CudaPlugin& plugin_or_throw() {
  const Loaded& p = plugin();
  if (p.table == nullptr)
    HL_FAIL("cuda: cannot load the CUDA backend ", kCudaPluginFile, ": tried ", p.why_not,
            "; set HEADLAB_CUDA_PLUGIN=/path/to/", kCudaPluginFile, " or use --device cpu");
  return *p.table;
}

}  // namespace

Backend& cuda_backend_instance(int device_index) { return *plugin_or_throw().backend_instance(device_index); }

bool cuda_device_visible() {
  const CudaPlugin* table = plugin().table;
  return table != nullptr && table->device_visible();
}

void cuda_set_allow_tf32(bool allow) { plugin_or_throw().set_allow_tf32(allow); }
bool cuda_allow_tf32() { return plugin_or_throw().allow_tf32(); }
void cuda_empty_cache(int device_index) { plugin_or_throw().empty_cache(device_index); }
size_t cuda_cached_bytes(int device_index) { return plugin_or_throw().cached_bytes(device_index); }

}  // namespace headlab
#endif  // HEADLAB_HAS_CUDA
