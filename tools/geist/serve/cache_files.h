// The names of the files in geist serve's disk cache directory (--cache-dir), and the
// removal of the temporary files a writer that was killed left behind. Model-free
// (serve_api_unit tests it); DiskCache uses it.
//   <16 hex digits>.geistsnap            an entry: a snapshot of the tokens of that hash
//   <16 hex digits>.geistsnap.tmp.<pid>  an entry being written by process pid (a rename
//                                        makes it the entry)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace geist::serve {

inline constexpr char kCacheFileSuffix[] = ".geistsnap";
inline constexpr char kCacheFileMagic[] = "GEISTSNP";  // a snapshot's first 8 bytes

// True, with the hash, for a name "<16 lowercase hex>.geistsnap"; false for any other.
bool cache_entry_name(const std::string &name, uint64_t *hash);
// The temporary name of an entry's file while process pid writes it.
std::string cache_temp_name(const std::string &entry_path, long pid);
// True, with the writer's pid, for a name "<16 lowercase hex>.geistsnap.tmp.<pid>" (pid
// in decimal, > 0, no leading zero); false for any other.
bool cache_temp_name_pid(const std::string &name, long *pid);

// Removes from dir the temporary files of writers that are gone: a regular file (not a
// symlink) with a temporary name whose process is not running (or is this one: a server
// calls this before it writes), and whose bytes are what a writer of a snapshot writes
// first (a prefix of the magic, or the magic and more). Nothing else is touched: not a
// running writer's file, not another name, not a file with other bytes. Returns how many
// were removed; *kept (if given): how many files with a temporary name were left, and why
// in *why_kept (the last one's reason). Errors reading the directory remove nothing.
size_t cache_remove_stale_temps(const std::string &dir, size_t *kept = nullptr,
                                std::string *why_kept = nullptr);

}  // namespace geist::serve
