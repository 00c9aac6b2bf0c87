// Ablating every head: one batched pass (evaluate_interventions: the data repeated once per
// intervention, each copy with its own gates and offsets) against one evaluation per head and kind
// (evaluate_heads: what ablate_heads did before). Both measure the unablated model and the zero and
// mean ablation of every head on the same EvalSet, float32, randomly initialised models (the cost does
// not depend on the weights):
//   demo:  the demo's model, reverse task, 2 layers x 4 heads, emb 64, 8 batches of 64 x 19 tokens
//   chars: 4 layers x 8 heads, emb 128, chars task on data/tiny.txt, 4 batches of 32 x 64 tokens
// Counter heads_per_s: ablated heads measured per second (2 kinds each). Threads: 1 and 2.
//   build: cmake --build build --target bench_heads; run: build/bench/bench_heads
#include <benchmark/benchmark.h>
#include <omp.h>

#include "analysis/heads.h"
#include "nn/decoder_family.h"
#include "tasks/task.h"

using namespace headlab;
using namespace headlab::analysis;

namespace {

struct Setup {
  std::unique_ptr<nn::DecoderModel> model;
  EvalSet data;
  std::vector<HeadIntervention> list;  // base, then zero and mean of every head
  std::vector<Tensor> means;
};

Setup make_setup(bool chars) {
  tasks::TaskOptions o;
  o.text_path = std::string(HEADLAB_SOURCE_DIR) + "/data/tiny.txt";
  const auto task = tasks::make_task(chars ? "chars" : "reverse", o);
  nn::DecoderConfig cfg;
  cfg.vocab_size = task->vocab_size();
  cfg.context_length = chars ? 64 : task->required_context_length();
  cfg.emb_dim = chars ? 128 : 64;
  cfg.n_heads = chars ? 8 : 4;
  cfg.n_layers = chars ? 4 : 2;
  manual_seed(1);
  Setup s;
  s.model = std::make_unique<nn::DecoderModel>(cfg);
  s.model->eval();
  s.data = make_eval_set(*task, chars ? 4 : 8, chars ? 32 : 64, cfg.context_length);
  s.list.push_back({});
  for (int64_t l = 0; l < cfg.n_layers; ++l)
    for (int64_t h = 0; h < cfg.n_heads; ++h)
      for (Ablation kind : {Ablation::zero, Ablation::mean}) s.list.push_back({l, h, kind, -1});
  s.means = mean_head_contexts(*s.model, s.data);
  return s;
}

// args: chars (0/1), threads
template <bool Batched>
void BM_ablate_all_heads(benchmark::State& state) {
  const int prev = omp_get_max_threads();
  omp_set_num_threads(static_cast<int>(state.range(1)));
  Setup s = make_setup(state.range(0) != 0);
  nn::DecoderModel& m = *s.model;
  const int64_t L = m.n_layers();
  for (auto _ : state) {
    if (Batched) {
      InterventionOptions o;
      o.means = s.means;
      benchmark::DoNotOptimize(evaluate_interventions(m, s.data, s.list, o));
    } else {
      benchmark::DoNotOptimize(evaluate_heads(m, s.data));
      for (size_t i = 1; i < s.list.size(); ++i) {
        const HeadIntervention& iv = s.list[i];
        HeadMatrix g = head_matrix(m, 1.0);
        g[static_cast<size_t>(iv.layer)][static_cast<size_t>(iv.head)] = 0;
        std::vector<Tensor> offsets(static_cast<size_t>(L));
        if (iv.kind == Ablation::mean) {
          const Tensor& mean = s.means[static_cast<size_t>(iv.layer)];  // (H, D)
          offsets[static_cast<size_t>(iv.layer)] = zeros(mean.shape());
          offsets[static_cast<size_t>(iv.layer)].select(0, iv.head).copy_(mean.select(0, iv.head));
        }
        benchmark::DoNotOptimize(evaluate_heads(m, s.data, g, offsets));
      }
    }
  }
  state.counters["heads_per_s"] = benchmark::Counter(
      static_cast<double>(count_heads(head_matrix(m, 1.0))) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  omp_set_num_threads(prev);
}

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t chars : {0, 1})
    for (int64_t threads : {1, 2}) b->Args({chars, threads});
  b->ArgNames({"chars", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_ablate_all_heads, false)->Name("per_head_passes")->Apply(Args);
BENCHMARK_TEMPLATE(BM_ablate_all_heads, true)->Name("batched_pass")->Apply(Args);

BENCHMARK_MAIN();
