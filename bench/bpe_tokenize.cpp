// GPT-2's byte-level BPE tokenizer (tasks/bpe_tokenizer.h) on English text, one thread: MB/s of
// UTF-8 input to ids. The text: FILE, or by default every licence text Debian ships in
// /usr/share/common-licenses (about 270 KB of distinct English prose). Two figures: the first pass
// over it (every word new to the tokenizer's merge cache) and the median of --repeats passes over the
// text repeated to --megabytes (the cached steady state a long file reaches).
// Usage: bpe_tokenize VOCAB_DIR [--text FILE] [--megabytes N] [--repeats R]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "tasks/bpe_tokenizer.h"

using namespace headlab;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bpe_tokenize VOCAB_DIR [--text FILE] [--megabytes N] [--repeats R]\n");
    return 2;
  }
  const std::string dir = argv[1];
  std::string text_path = "/usr/share/common-licenses";
  double megabytes = 8;
  int repeats = 5;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--text")
      text_path = argv[i + 1];
    else if (k == "--megabytes")
      megabytes = std::stod(argv[i + 1]);
    else if (k == "--repeats")
      repeats = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "bpe_tokenize: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const tasks::BpeTokenizer tok = tasks::BpeTokenizer::from_files(dir + "/vocab.json", dir + "/merges.txt");
  std::vector<std::string> files{text_path};
  if (std::filesystem::is_directory(text_path)) {
    files.clear();
    for (const auto& e : std::filesystem::directory_iterator(text_path))
      if (e.is_regular_file()) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
  }
  std::ostringstream s;
  for (const std::string& f : files) s << std::ifstream(f, std::ios::binary).rdbuf();
  const std::string one = s.str(), label = text_path;
  if (one.empty()) {
    std::fprintf(stderr, "bpe_tokenize: %s is empty or unreadable\n", text_path.c_str());
    return 1;
  }
  auto t0 = bench::clock_type::now();
  const size_t first_ids = tok.encode(one, label).size();
  const double first = bench::seconds_since(t0);
  std::string text;
  while (double(text.size()) < megabytes * 1e6) text += one;
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    t0 = bench::clock_type::now();
    (void)tok.encode(text, label);
    seconds.push_back(bench::seconds_since(t0));
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2], mb = double(text.size()) / 1e6, mb1 = double(one.size()) / 1e6;
  std::printf(
      "%s (%zu files, %.2f MB, %zu tokens, %.2f bytes/token): first pass %.2f MB/s; repeated to %.1f MB, "
      "median of %d passes %.2f MB/s\n",
      text_path.c_str(), files.size(), mb1, first_ids, double(one.size()) / double(first_ids), mb1 / first, mb, repeats,
      mb / median);
  return 0;
}
