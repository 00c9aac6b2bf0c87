// See omp_policy.h.
#include "backends/cpu/omp_policy.h"

#include <unistd.h>

#include <cstdlib>

namespace headlab::cpu {

void restart_with_passive_omp_waits(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (::setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  ::execv("/proc/self/exe", argv);  // only returns on failure: then run on with libgomp's default
}

}  // namespace headlab::cpu
