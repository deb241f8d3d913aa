// Snapshot files on disk: which paths geist may write, the atomic write, and a read that
// looks at the header before it reads the rest.
//
// The rule for writing: geist replaces a path only if it does not exist, is an empty
// regular file, or is a regular file that starts with the snapshot magic ("GEISTSNP").
// Symlinks, directories, FIFOs, devices, sockets and every other file are refused with
// GEIST_E_IO before anything is written, so a mistyped path can never destroy a user's
// file (a prompt, a model, /dev/null).
//
// Thread safety: the functions are reentrant; two writers of one path each leave a
// whole file (the last rename wins).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace geist {

inline constexpr char kSnapshotMagic[8] = {'G', 'E', 'I', 'S', 'T', 'S', 'N', 'P'};

// OK if geist may write a snapshot to path (the rule above) and the directory accepts a
// new file (probed by creating and removing an unnamed temporary file). GEIST_E_IO with a
// message naming the path and the reason otherwise. Touches nothing.
Status check_snapshot_target(const std::string &path);

// Writes data[0, n) to path: a temporary file in path's directory (O_TMPFILE where the
// filesystem has it, else "PATH.tmp.<pid>.<k>" held under flock), fsync, the rule above
// checked on what is at path right before the rename over it, fsync of the directory.
// (Callers check the whole rule first, so a refused path costs no work.) A crash leaves
// path either old or new, never half written. Temporary files that a killed writer left
// next to path are removed (only ones no live process holds and that are empty or start
// with the magic). GEIST_E_IO on any failure, with path untouched.
Status write_snapshot_file(const std::string &path, const uint8_t *data, size_t n);

// Reads a snapshot file without hanging on a FIFO and without reading what is not a
// snapshot: opens path non-blocking, refuses anything but a regular file, reads the
// first min(header_bytes, size) bytes and calls check(header, bytes read, file size);
// only if that returns OK are the rest of the bytes read into *out (the whole file).
Status read_snapshot_file(const std::string &path, size_t header_bytes,
                          const std::function<Status(const uint8_t *, size_t, uint64_t)> &check,
                          std::vector<uint8_t> *out);

}  // namespace geist
