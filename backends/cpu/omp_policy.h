// The threading policy of the CPU backend: OpenMP threads wait passively between parallel regions.
// libgomp's default lets idle threads spin after each region; on the 2-core machines this project
// runs on, a spinning thread halves the speed of a training step (toy GPT, 2 threads: 170 ms/step
// spinning, 80 ms/step passive). libgomp reads the policy once, before main, so a program must
// start with it: restart_with_passive_omp_waits re-executes the program with
// OMP_WAIT_POLICY=passive unless the user chose a policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT set).
#pragma once

namespace headlab::cpu {

// Call in main() before anything with effects (a command line may be parsed first); returns when
// there is nothing to do (or exec failed).
void restart_with_passive_omp_waits(char** argv);

}  // namespace headlab::cpu
