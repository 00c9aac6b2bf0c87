// How headlab writes files: the atomic writer (io/atomic_file.h), the removal of dead writers' temp
// files (io/temp_files.h), and the result tables' renderers (analysis/table.h).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "analysis/files.h"
#include "analysis/table.h"
#include "io/atomic_file.h"
#include "io/temp_files.h"
#include "process_util.h"

namespace fs = std::filesystem;
using namespace headlab;
using headlab::testing::run_in_child;
using headlab::testing::slurp;
using headlab::testing::TempDir;

namespace {

void touch(const std::string& path, const std::string& text = "x") { std::ofstream(path) << text; }

// A table with every kind of column, a NaN and text that CSV must quote.
analysis::Table sample_table() {
  analysis::Table t("scores", {analysis::text_column("head"),
                               {"loss", analysis::NumberFormat::fixed, 3},
                               {"d loss", analysis::NumberFormat::signed_fixed, 2},
                               {"raw", analysis::NumberFormat::scientific, 1},
                               {"n", analysis::NumberFormat::integer, 0}});
  t.add_row({"L0H1", 1.23456, 0.5, 0.000123, 7.0});
  t.add_row({"a, \"b\"", std::nan(""), -0.125, 12345.0, 12.0});
  return t;
}

}  // namespace

// ---- table renderers -------------------------------------------------------------------------------

TEST(Table, CellsFollowTheirColumnsFormat) {
  const analysis::Table t = sample_table();
  EXPECT_EQ(analysis::format_cell(1.23456, t.columns[1]), "1.235");
  EXPECT_EQ(analysis::format_cell(0.5, t.columns[2]), "+0.50");
  EXPECT_EQ(analysis::format_cell(-0.125, t.columns[2]), "-0.12");
  EXPECT_EQ(analysis::format_cell(0.000123, t.columns[3]), "1.2e-04");
  EXPECT_EQ(analysis::format_cell(7.0, t.columns[4]), "7");
  EXPECT_EQ(analysis::format_cell(std::nan(""), t.columns[1]), "nan");
  EXPECT_EQ(analysis::format_cell(std::string("text"), t.columns[1]), "text");
}

TEST(Table, TextIsAlignedByColumn) {
  EXPECT_EQ(analysis::render_text(sample_table()),
            "scores\n"
            "  head     loss  d loss      raw   n\n"
            "  L0H1    1.235   +0.50  1.2e-04   7\n"
            "  a, \"b\"    nan   -0.12  1.2e+04  12\n");
  analysis::Table untitled("", {analysis::text_column("x"), analysis::text_column("removed")});
  untitled.add_row({"y", ""});
  untitled.add_row({"z", "L0H1"});
  EXPECT_EQ(analysis::render_text(untitled, 0), "x  removed\ny\nz  L0H1\n");
}

TEST(Table, Markdown) {
  analysis::Table t = sample_table();
  t.add_row({"a|b", 1.0, 0.0, 1.0, 1.0});
  EXPECT_EQ(analysis::render_markdown(t),
            "| head | loss | d loss | raw | n |\n"
            "|---|---|---|---|---|\n"
            "| L0H1 | 1.235 | +0.50 | 1.2e-04 | 7 |\n"
            "| a, \"b\" | nan | -0.12 | 1.2e+04 | 12 |\n"
            "| a\\|b | 1.000 | +0.00 | 1.0e+00 | 1 |\n");
}

TEST(Table, CsvQuotesAndKeepsFullPrecision) {
  analysis::Table t = sample_table();
  t.add_row({"two\nlines", 1.0 / 3.0, 0.0, 1.0, 2.6});
  EXPECT_EQ(analysis::render_csv(t),
            "head,loss,d loss,raw,n\n"
            "L0H1,1.23456,0.5,0.000123,7\n"
            "\"a, \"\"b\"\"\",nan,-0.125,12345,12\n"
            "\"two\nlines\",0.3333333333,0,1,3\n");
}

TEST(Table, RowsMustMatchTheColumns) {
  analysis::Table t = sample_table();
  try {
    t.add_row({"L1H0", 1.0});
    FAIL() << "a short row was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Table 'scores': expected 5 cells in a row, got 2"), std::string::npos)
        << e.what();
  }
}

// ---- the atomic writer -----------------------------------------------------------------------------

TEST(AtomicFile, ReplacesTheFileAndLeavesNoTempFile) {
  TempDir tmp("files_test");
  const std::string p = tmp.path("heads.csv");
  touch(p, "old");
  io::write_file_atomic(p, "new content\n", "heads");
  EXPECT_EQ(slurp(p), "new content\n");
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"heads.csv"});

  {  // nothing appears under the name before commit(); destroyed uncommitted: the old file stays
    io::AtomicFile f(p, "heads");
    EXPECT_EQ(f.temp_path(), tmp.path(".headlab-tmp-" + std::to_string(::getpid()) + ".heads.csv"));
    f.write("half");
    EXPECT_TRUE(fs::exists(f.temp_path()));
    EXPECT_EQ(slurp(p), "new content\n");
  }
  EXPECT_EQ(slurp(p), "new content\n");
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"heads.csv"});

  {  // a writer that fills the temp file by name (as HDF5 and PLplot do)
    io::AtomicFile f(p, "heads");
    touch(f.temp_path(), "by name");
    f.commit();
  }
  EXPECT_EQ(slurp(p), "by name");
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"heads.csv"});
}

// A copy through the atomic writer: more than its MiB buffer (the last piece short), an empty file, and a
// source that cannot be read named, with the previous file left as it was.
TEST(AtomicFile, CopiesAFileWhole) {
  TempDir tmp("files_test");
  std::string bytes((1 << 20) * 2 + 12345, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 % 251);
  touch(tmp.path("from.h5"), bytes);
  touch(tmp.path("to.h5"), "old");
  io::copy_file_atomic(tmp.path("from.h5"), tmp.path("to.h5"), "checkpoint");
  EXPECT_EQ(slurp(tmp.path("to.h5")), bytes);
  touch(tmp.path("empty"), "");
  io::copy_file_atomic(tmp.path("empty"), tmp.path("to.h5"), "checkpoint");
  EXPECT_EQ(slurp(tmp.path("to.h5")), "");
  touch(tmp.path("to.h5"), "kept");
  try {
    io::copy_file_atomic(tmp.path("absent.h5"), tmp.path("to.h5"), "checkpoint");
    FAIL() << "a missing source was copied";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 ("checkpoint: cannot read '" + tmp.path("absent.h5") + "': No such file or directory").c_str());
  }
  EXPECT_EQ(slurp(tmp.path("to.h5")), "kept");
  EXPECT_EQ(tmp.entries(), (std::vector<std::string>{"empty", "from.h5", "to.h5"}));
}

// A write that fails half-way (a file size limit, as a full disk) names the file and the OS's reason,
// removes its temp file and leaves the previous file as it was.
TEST(AtomicFile, AFailedWriteKeepsThePreviousFile) {
  TempDir tmp("files_test");
  const std::string p = tmp.path("out/heads.csv");
  fs::create_directories(tmp.path("out"));
  touch(p, "previous");
  const auto outcome = run_in_child([&] {
    ::signal(SIGXFSZ, SIG_IGN);  // the write then fails with EFBIG instead of killing the process
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    io::write_file_atomic(p, std::string(100000, 'x'), "heads");
  });
  ASSERT_TRUE(outcome.abnormal.empty()) << outcome.abnormal;
  ASSERT_TRUE(outcome.error);
  EXPECT_EQ(outcome.message, "heads: cannot write '" + p + "': File too large");
  EXPECT_EQ(slurp(p), "previous");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(tmp.path("out"))) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"heads.csv"});
}

// A picture is written through the same temp name and rename: a PLplot write that fails keeps the
// previous picture, leaves no temp file, and the error names the picture, not the temp name.
TEST(AtomicFile, PicturesAreReplacedAtomically) {
  TempDir tmp("files_test");
  const std::string p = tmp.path("pruning.png");
  analysis::PruningCurve c;
  c.total_heads = 2;
  for (int i = 0; i < 2; ++i) {
    analysis::PruneStep s;
    s.pruned = i;
    s.fraction = 0.5 * i;
    s.scores.token_accuracy = 0.9 - 0.2 * i;
    c.steps.push_back(s);
  }
  analysis::save_pruning_png(p, c, 0.5);
  const std::string first = slurp(p);
  ASSERT_GT(first.size(), 1000u);
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"pruning.png"});
  const auto outcome = run_in_child([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{512, 512};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    analysis::save_pruning_png(p, c, 0.7);
  });
  ASSERT_TRUE(outcome.abnormal.empty()) << outcome.abnormal;
  ASSERT_TRUE(outcome.error);
  EXPECT_EQ(outcome.message, "save_line_chart: cannot write '" + p + "': File too large");
  EXPECT_EQ(outcome.message.find("headlab-tmp"), std::string::npos) << outcome.message;
  EXPECT_EQ(slurp(p), first);
  EXPECT_EQ(tmp.entries(), std::vector<std::string>{"pruning.png"});
}

// A new file gets the permissions any new file gets (0666 less the umask), as the streams it replaced gave.
TEST(AtomicFile, PermissionsFollowTheUmask) {
  TempDir tmp("files_test");
  const mode_t old = ::umask(002);
  io::write_file_atomic(tmp.path("shared.csv"), "x", "test");
  ::umask(old);
  EXPECT_EQ(fs::status(tmp.path("shared.csv")).permissions(), fs::perms::owner_read | fs::perms::owner_write |
                                                                  fs::perms::group_read | fs::perms::group_write |
                                                                  fs::perms::others_read);
}

TEST(AtomicFile, AMissingFolderIsNamed) {
  TempDir tmp("files_test");
  const std::string p = tmp.path("missing/report.md");
  try {
    io::write_file_atomic(p, "x", "ablate");
    FAIL() << "wrote into a missing folder";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "ablate: cannot write '" + p + "': No such file or directory (folder '" +
                                         tmp.path("missing") + "' does not exist)");
  }
  EXPECT_FALSE(fs::exists(tmp.path("missing")));
}

// ---- dead writers' temp files ----------------------------------------------------------------------

TEST(TempFiles, OnlyHeadlabsOwnDeadTempFilesAreRemoved) {
  TempDir tmp("files_test");
  // A pid that no longer runs: a child that has exited and been reaped.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(dead, &status, 0), dead);
  const std::string d = std::to_string(dead), live = std::to_string(::getppid());
  const std::string headlab_dead = ".headlab-tmp-" + d + ".checkpoint.h5",
                    headlab_live = ".headlab-tmp-" + live + ".a.csv", users = "notes.tmp." + d,
                    old_style = "checkpoint.h5.tmp." + d, lookalike = ".headlab-tmp-" + d;
  for (const std::string& n : {headlab_dead, headlab_live, users, old_style, lookalike}) touch(tmp.path(n));
  EXPECT_EQ(io::remove_stale_temp_files(tmp.dir()), std::vector<std::string>{tmp.path(headlab_dead)});
  EXPECT_FALSE(fs::exists(tmp.path(headlab_dead)));
  for (const std::string& n : {headlab_live, users, old_style, lookalike}) EXPECT_TRUE(fs::exists(tmp.path(n))) << n;
  EXPECT_EQ(io::temp_path_for("run/metrics.csv"), "run/.headlab-tmp-" + std::to_string(::getpid()) + ".metrics.csv");
  EXPECT_EQ(io::temp_path_for("x.png"), ".headlab-tmp-" + std::to_string(::getpid()) + ".x.png");
}
