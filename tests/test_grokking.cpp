// examples/grokking: Nanda et al.'s modular-addition checkpoint through headlab's forward and the paper's maths
// (examples/grokking.h). The split is Python's random.shuffle, checked against python3 itself; the analysis runs
// as `grokking --check` does, where ../shared/models/grokking holds the checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "examples/grokking.h"
#include "tests/process_util.h"

namespace g = headlab::examples::grokking;
using headlab::testing::TempDir;

namespace {

const std::string kModel =
    std::string(HEADLAB_SOURCE_DIR) + "/../shared/models/grokking/wd_10-1_mod_addition_loss_curve.pth";

std::string first_pairs(const g::Split& s, int n) {
  std::ostringstream o;
  for (int i = 0; i < n; ++i) o << (i > 0 ? " " : "") << s.order[i] / g::kP << "," << s.order[i] % g::kP;
  return o.str();
}

}  // namespace

// python3 -c "import random; p=[(i,j) for i in range(113) for j in range(113)]; random.seed(1); random.shuffle(p);
// print(p[:5])" prints [(58, 58), (76, 57), (60, 23), (100, 89), (29, 27)].
TEST(Grokking, SplitIsPythonsShuffle) {
  const g::Split s = g::python_split(1, 0.3);
  EXPECT_EQ(first_pairs(s, 5), "58,58 76,57 60,23 100,89 29,27");
  EXPECT_EQ(s.n_train, 3830);  // int(0.3 * 12769)
  if (!std::filesystem::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3 to compare the whole order with";
  const TempDir tmp("grokking_split");
  const auto r = headlab::testing::run_process(
      {"/usr/bin/python3", "-c",
       "import random\np=[(i,j) for i in range(113) for j in range(113)]\nrandom.seed(1)\nrandom.shuffle(p)\n"
       "print(' '.join(f'{a},{b}' for a,b in p))"},
      tmp.dir());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(first_pairs(s, g::kPairs) + "\n", r.out);
}

TEST(Grokking, FourierBasisIsOrthonormal) {
  const headlab::Tensor b = g::fourier_basis();
  const auto gram = headlab::matmul(b, b.mT()).to_vector<double>();
  double worst = 0;
  for (int64_t i = 0; i < g::kP; ++i)
    for (int64_t j = 0; j < g::kP; ++j) worst = std::max(worst, std::abs(gram[i * g::kP + j] - (i == j ? 1.0 : 0.0)));
  EXPECT_LT(worst, 1e-12);
}

// What `grokking --check --out DIR` runs: every bound of failures() holds, and the pictures are written.
TEST(Grokking, PaperCheckpointReproduces) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << "no " << kModel << " (../shared/models/grokking)";
  const TempDir tmp("grokking");
  std::ostringstream log;
  const g::Report r = g::run({kModel, tmp.dir()}, log);
  EXPECT_TRUE(g::failures(r).empty()) << log.str();
  for (const auto& p : r.pictures) EXPECT_GT(std::filesystem::file_size(p), 1000u) << p;
  EXPECT_EQ(r.pictures.size(), 3u);
}
