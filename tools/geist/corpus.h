// Built-in English text for benchmark prompts (so `geist bench` needs no input file and
// every run on every machine prefills the same tokens).
#pragma once

#include <string_view>

namespace geist::cli {

// Genesis 1-4 of the King James Version (public domain; the text of Debian's bible-kjv
// package, verse labels removed, one verse per line): about 13.8 KB of plain ASCII.
std::string_view bench_corpus();

}  // namespace geist::cli
