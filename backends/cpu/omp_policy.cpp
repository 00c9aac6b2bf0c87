// See omp_policy.h.
#include "backends/cpu/omp_policy.h"

#include <unistd.h>

#include <cstdlib>

namespace headlab::cpu {

void restart_with_omp_wait_policy(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (::setenv("GOMP_SPINCOUNT", kOmpSpinCount, 1) != 0) return;
  ::execv("/proc/self/exe", argv);  // only returns on failure: then run on with libgomp's default
}

}  // namespace headlab::cpu
