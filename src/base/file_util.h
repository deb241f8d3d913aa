// Small POSIX file helpers for messages and safe reads. Thread safe (no shared state).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

#include "base/status.h"

namespace geist {

// "a directory", "a FIFO (named pipe)", "a character device", ... for st_mode; used in
// messages such as "'x' is a directory".
const char *file_kind(mode_t mode);

// Reads the whole of path into *out, at most max_bytes. Regular files, FIFOs and
// character devices (a pipe, /dev/stdin) are read; directories, sockets and block
// devices are refused. A stream longer than max_bytes fails with GEIST_E_INVALID_ARGUMENT
// after reading max_bytes + 1 bytes (so /dev/zero cannot exhaust memory). Errors name the
// path and the cause (strerror). Cost: one pass over the bytes.
Status read_file_limited(const std::string &path, size_t max_bytes, std::string *out);

// True if both paths exist and name the same file (device and inode, symlinks followed).
bool same_file(const std::string &a, const std::string &b);

// The directory part of path ("." for a bare name, "/" for "/x").
std::string dir_of(const std::string &path);

}  // namespace geist
