// The threading policy of the CPU backend: OpenMP threads spin briefly after a parallel region, then sleep.
// libgomp's default spins for 300,000 rounds of `pause` (milliseconds): on the 2-core machines this project
// runs on, such spinning once halved the speed of a training step (toy GPT, 2 threads: 170 ms/step
// spinning, 80 ms/step passive), and the policy was passive (spin count 0). But a thread that sleeps at
// once must be woken for the next region, which in these virtual machines costs tens of microseconds:
// decoding, a hundred short regions a token, spent a quarter of its time there. Measured on a 2-core
// Ice Lake VM (2026-11-28, interleaved rounds): GPT-2 small decoding 31-35 ms/token passive, 24.5-26 at a
// spin count of 10,000, 22.6-23.6 at 30,000, 22.8-27.7 at 100,000; the toy step with every op split 62
// ms passive, 41-51 at 30,000 (threads on their rows of the batch do not use OpenMP's team). libgomp
// reads the policy once, before main, so a program must start with it: restart_with_omp_wait_policy
// re-executes the program with GOMP_SPINCOUNT=kOmpSpinCount unless the user chose a policy
// (OMP_WAIT_POLICY or GOMP_SPINCOUNT set). libgomp itself cuts the spin to 1,000 rounds when a process
// has more OpenMP threads than CPUs.
#pragma once

namespace headlab::cpu {

inline constexpr const char* kOmpSpinCount = "30000";

// Call in main() before anything with effects (a command line may be parsed first); returns when
// there is nothing to do (or exec failed).
void restart_with_omp_wait_policy(char** argv);

}  // namespace headlab::cpu
