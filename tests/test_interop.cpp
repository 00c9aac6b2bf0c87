// PyTorch interop (tools/export_torch.py, tools/import_torch.py, tools/book_gpt.py): a model trained
// here is exported, loaded into the book's GPTModel with load_state_dict(strict=True), gives the same
// logits and loss on the same batch in both frameworks, and imports back bit for bit; a model built
// with the book's code imports with a config and computes the same logits here. Skips (with the
// reason) where /usr/bin/python3 cannot import torch and h5py.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nn/decoder_family.h"
#include "tests/process_util.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace headlab;
using namespace headlab::train;
using namespace headlab::tasks;
using namespace headlab::io;
using namespace headlab::optim;
using headlab::testing::quote;
using headlab::testing::run_process;
using headlab::testing::slurp;
using headlab::testing::TempDir;
using Result = headlab::testing::ProcessResult;

namespace {

const std::string kPython = "/usr/bin/python3";
const std::string kTools = std::string(HEADLAB_SOURCE_DIR) + "/tools";

// Why PyTorch interop cannot be tested here, or "" when it can.
std::string torch_unavailable() {
  static const std::string why = [] {
    if (::access(kPython.c_str(), X_OK) != 0) return kPython + " does not exist";
    const int status = std::system((quote(kPython) + " -c 'import torch, h5py' >/dev/null 2>&1").c_str());
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return kPython + " cannot import torch and h5py (install python3-torch and python3-h5py)";
    return std::string();
  }();
  return why;
}

class InteropTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = torch_unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
    omp_set_num_threads(1);
  }
  std::string path(const std::string& name) const { return tmp_.path(name); }
  Result python(std::vector<std::string> args) {
    args.insert(args.begin(), kPython);
    return run_process(args, tmp_.dir(), "OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1");
  }
  TempDir tmp_{"interop_test"};
};

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

nlohmann::json ids_json(const std::vector<int64_t>& v, int64_t B, int64_t T) {
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t b = 0; b < B; ++b) rows.push_back(std::vector<int64_t>(v.begin() + b * T, v.begin() + (b + 1) * T));
  return rows;
}

// Loads each exported .pt into book_gpt.GPTModel (strict), and writes logits and loss on the batch.
const char* kCheckScript = R"PY(
import json, sys
import torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
import book_gpt
batch = json.load(open(sys.argv[2]))
results = {}
for name, pt in batch["files"].items():
    ck = torch.load(pt)
    model = book_gpt.GPTModel(ck["config"])
    missing_unexpected = model.load_state_dict(ck["model_state_dict"], strict=True)
    model.eval()
    idx = torch.tensor(batch["idx"], dtype=torch.long)
    targets = torch.tensor(batch["targets"], dtype=torch.long)
    with torch.no_grad():
        logits = model(idx)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    results[name] = {"loss": float(loss), "logits": logits.flatten().tolist(),
                     "keys": list(ck["model_state_dict"].keys()), "config": ck["config"],
                     "dtype": str(logits.dtype)}
json.dump(results, open(sys.argv[3], "w"))
)PY";

TEST_F(InteropTest, TrainedHereExportsToTheBooksModelAndImportsBackExactly) {
  struct Variant {
    std::string attention;
    bool qkv_bias;
  };
  const std::vector<Variant> variants = {{"fused", false}, {"wrapper", true}};
  nlohmann::json batch_json = {{"files", nlohmann::json::object()}};
  std::map<std::string, Tensor> logits_here;
  std::map<std::string, double> loss_here;
  std::map<std::string, Checkpoint> trained;
  int64_t B = 4, T = 0;
  for (const Variant& v : variants) {
    TrainOptions o;
    o.config.task.name = "reverse";
    o.config.task.options.min_len = 2;
    o.config.task.options.max_len = 4;
    o.model.emb_dim = 16;
    o.model.n_heads = 2;
    o.model.n_layers = 2;
    o.model.attention = parse_enum<nn::AttentionForm>(v.attention, "test");
    o.model.qkv_bias = v.qkv_bias;
    o.config.run.steps = 20;
    o.config.run.batch_size = 16;
    o.config.schedule.warmup = 2;
    o.config.run.eval_every = 20;
    o.config.run.eval_batches = 1;
    o.out = path(v.attention);
    o.quiet = true;
    Trainer(o).run();
    const std::string ckpt = path(v.attention + "/checkpoint.h5");
    trained[v.attention] = load_checkpoint(ckpt);

    const std::string pt = path(v.attention + ".pt");
    const Result ex = python({kTools + "/export_torch.py", ckpt, pt});
    ASSERT_EQ(ex.code, 0) << ex.err;
    EXPECT_TRUE(ex.out.find("wrote " + pt) != std::string::npos) << ex.out;
    batch_json["files"][v.attention] = pt;

    // The same validation batch through headlab.
    auto model = model_from_checkpoint<nn::DecoderModel>(trained[v.attention], ckpt);
    const auto task = RunConfig::from_json(trained[v.attention].config).make_task();
    T = model->config().context_length;
    const Batch b = task->batch(Split::val, 0, B, T);
    batch_json["idx"] = ids_json(b.inputs, B, T);
    batch_json["targets"] = ids_json(b.targets, B, T);
    NoGradGuard no_grad;
    const Tensor logits = (*model)(tensor(b.inputs, {B, T}));
    const int64_t V = model->config().vocab_size;
    logits_here[v.attention] = logits;
    loss_here[v.attention] = cross_entropy(logits.reshape({-1, V}), tensor(b.targets, {B * T}), -100).item<double>();
  }
  std::ofstream(path("batch.json")) << batch_json.dump();
  std::ofstream(path("check.py")) << kCheckScript;
  const Result check = python({path("check.py"), kTools, path("batch.json"), path("torch.json")});
  ASSERT_EQ(check.code, 0) << check.err;
  const nlohmann::json torch_results = nlohmann::json::parse(slurp(path("torch.json")));

  for (const Variant& v : variants) {
    const nlohmann::json& r = torch_results.at(v.attention);
    EXPECT_EQ(r.at("dtype"), "torch.float32");
    // Same loss and logits in both frameworks (float32 on both sides).
    const double loss = r.at("loss");
    EXPECT_NEAR(loss, loss_here[v.attention], 1e-5 * std::max(1.0, std::abs(loss))) << v.attention;
    const std::vector<double> theirs = r.at("logits").get<std::vector<double>>();
    const std::vector<double> mine = logits_here[v.attention].to_vector<double>();
    ASSERT_EQ(theirs.size(), mine.size());
    for (size_t i = 0; i < mine.size(); ++i)
      ASSERT_NEAR(mine[i], theirs[i], 1e-5 * std::max(1.0, std::abs(theirs[i]))) << v.attention << " logit " << i;
    // The state_dict: every parameter under its name plus the book's mask buffers.
    const auto keys = r.at("keys").get<std::vector<std::string>>();
    const Checkpoint& ck = trained[v.attention];
    for (const auto& [name, t] : ck.model) EXPECT_NE(std::find(keys.begin(), keys.end(), name), keys.end()) << name;
    const size_t masks = v.attention == "fused" ? 2 : 4;  // per layer: one, or one per head
    EXPECT_EQ(keys.size(), ck.model.size() + masks);
    EXPECT_NE(std::find(keys.begin(), keys.end(),
                        v.attention == "fused" ? "trf_blocks.1.att.mask" : "trf_blocks.1.att.heads.1.mask"),
              keys.end());
    EXPECT_EQ(r.at("config").at("attention"), v.attention);
    EXPECT_EQ(r.at("config").at("qkv_bias"), v.qkv_bias);

    // And back: parameters bit for bit, the same config sections.
    const std::string back = path(v.attention + "_back.h5");
    const Result im = python({kTools + "/import_torch.py", path(v.attention + ".pt"), back});
    ASSERT_EQ(im.code, 0) << im.err;
    {  // written as headlab writes: /model's links compact (checksummed), int64 format_version
      const hid_t f = H5Fopen(back.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      ASSERT_GE(f, 0);
      const hid_t g = H5Gopen2(f, "model", H5P_DEFAULT);
      H5G_info_t info{};
      EXPECT_GE(H5Gget_info(g, &info), 0);
      EXPECT_EQ(info.storage_type, H5G_STORAGE_TYPE_COMPACT) << info.nlinks << " links";
      const hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
      const hid_t t = H5Aget_type(a);
      EXPECT_GT(H5Tequal(t, H5T_STD_I64LE), 0);
      const hid_t d = H5Dopen2(f, "model/tok_emb.weight", H5P_DEFAULT);
      const hid_t dcpl = H5Dget_create_plist(d);
      EXPECT_EQ(H5Pget_layout(dcpl), H5D_CHUNKED);
      unsigned flags = 0, filter_config = 0;
      size_t nelem = 0;
      char fname[32];
      EXPECT_GE(H5Pget_filter_by_id2(dcpl, H5Z_FILTER_FLETCHER32, &flags, &nelem, nullptr, sizeof fname, fname,
                                     &filter_config),
                0);
      H5Pclose(dcpl);
      H5Dclose(d);
      H5Tclose(t);
      H5Aclose(a);
      H5Gclose(g);
      H5Fclose(f);
    }
    const Checkpoint again = load_checkpoint(back);
    ASSERT_EQ(again.model.size(), ck.model.size());
    for (size_t i = 0; i < ck.model.size(); ++i) {
      EXPECT_EQ(again.model[i].first, ck.model[i].first);
      EXPECT_TRUE(same_bits(again.model[i].second, ck.model[i].second)) << ck.model[i].first;
    }
    for (const char* section : {"model", "tokenizer", "task"})
      EXPECT_EQ(again.config[section], ck.config[section]) << section;
    EXPECT_FALSE(again.has_optimizer);
    EXPECT_FALSE(again.has_trainer);
    for (const auto& e : fs::directory_iterator(tmp_.dir()))
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "left behind: " << e.path();
  }
}

// A model made with the book's code (a bare state_dict, as `torch.save(model.state_dict(), ...)`
// writes) imports with its config and a task, and computes here what it computes in PyTorch.
const char* kBookScript = R"PY(
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
import book_gpt
cfg = {"vocab_size": 14, "context_length": 12, "emb_dim": 16, "n_heads": 4, "n_layers": 2,
       "drop_rate": 0.1, "qkv_bias": True, "attention": sys.argv[2]}
torch.manual_seed(123)
model = book_gpt.GPTModel(cfg)
model.eval()
torch.save(model.state_dict(), sys.argv[3])
json.dump(cfg, open(sys.argv[4], "w"))
idx = torch.tensor([[1, 2, 3, 10, 4, 5, 11, 9], [0, 0, 7, 10, 9, 9, 11, 3]])
with torch.no_grad():
    logits = model(idx)
    out = book_gpt.generate_text_simple(model, idx[:1, :6], 10, cfg["context_length"])
json.dump({"logits": logits.flatten().tolist(), "idx": idx.tolist(), "generated": out[0].tolist()},
          open(sys.argv[5], "w"))
)PY";

TEST_F(InteropTest, BookModelImportsWithAConfigAndATask) {
  std::ofstream(path("book.py")) << kBookScript;
  const Result made =
      python({path("book.py"), kTools, "wrapper", path("book.pt"), path("book_cfg.json"), path("book_out.json")});
  ASSERT_EQ(made.code, 0) << made.err;
  const Result im = python({kTools + "/import_torch.py", path("book.pt"), path("book.h5"), "--config",
                            path("book_cfg.json"), "--task", "add", "--task-option", "n_digits=2"});
  ASSERT_EQ(im.code, 0) << im.err;

  const Checkpoint ck = load_checkpoint(path("book.h5"));
  EXPECT_EQ(ck.config["task"]["name"], "add");
  EXPECT_EQ(ck.config["tokenizer"]["vocab"].size(), 14u);
  auto model = model_from_checkpoint<nn::DecoderModel>(ck, path("book.h5"));
  EXPECT_EQ(model->config().attention, nn::AttentionForm::wrapper);
  const nlohmann::json out = nlohmann::json::parse(slurp(path("book_out.json")));
  std::vector<int64_t> idx;
  for (const auto& row : out.at("idx"))
    for (const auto& x : row) idx.push_back(x.get<int64_t>());
  NoGradGuard no_grad;
  const std::vector<double> mine = (*model)(tensor(idx, {2, 8})).to_vector<double>();
  const std::vector<double> theirs = out.at("logits").get<std::vector<double>>();
  ASSERT_EQ(mine.size(), theirs.size());
  for (size_t i = 0; i < mine.size(); ++i)
    ASSERT_NEAR(mine[i], theirs[i], 1e-5 * std::max(1.0, std::abs(theirs[i]))) << "logit " << i;
  // The book's greedy generate_text_simple, reproduced with headlab's model (past the context: 16 > 12).
  std::vector<int64_t> seq(idx.begin(), idx.begin() + 6);
  for (int i = 0; i < 10; ++i) {
    const int64_t start = std::max<int64_t>(0, int64_t(seq.size()) - 12);
    std::vector<int64_t> window(seq.begin() + start, seq.end());
    const Tensor logits = (*model)(tensor(window, {1, int64_t(window.size())}));
    seq.push_back(argmax(logits.select(1, int64_t(window.size()) - 1).select(0, 0), 0).item<int64_t>());
  }
  EXPECT_EQ(seq, out.at("generated").get<std::vector<int64_t>>());
  // The imported model is usable as a task checkpoint (evaluate needs the task and tokenizer).
  const auto task = RunConfig::from_json(ck.config).make_task();
  const Scores e = evaluate(*model, *task, 1, 8, model->config().context_length);
  EXPECT_GT(e.tokens, 0);

  // A config that does not describe the state_dict is refused, naming the parameter.
  nlohmann::json wrong = nlohmann::json::parse(slurp(path("book_cfg.json")));
  wrong["attention"] = "fused";
  const Result bad =
      python({kTools + "/import_torch.py", path("book.pt"), path("bad.h5"), "--config", wrong.dump(), "--task", "add"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("import_torch: '" + path("book.pt") + "': buffer trf_blocks.0.att.heads.0.mask"),
            std::string::npos)
      << bad.err;
  EXPECT_NE(bad.err.find("does not belong to the model the config describes"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(path("bad.h5")));
  const Result no_task =
      python({kTools + "/import_torch.py", path("book.pt"), path("bad.h5"), "--config", path("book_cfg.json")});
  EXPECT_EQ(no_task.code, 1);
  EXPECT_NE(no_task.err.find("give --task"), std::string::npos) << no_task.err;
}

TEST_F(InteropTest, ExportRefusesWhatIsNotACheckpoint) {
  std::ofstream(path("notes.h5")) << "text";
  const Result r = python({kTools + "/export_torch.py", path("notes.h5"), path("x.pt")});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("export_torch: checkpoint '" + path("notes.h5") + "'"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("x.pt")));
}

}  // namespace
