/* geist: run language models locally from GGUF files.
 *
 * Public C ABI. Plain C (C99), usable from C, C++, Python ctypes, Go and Rust.
 * No exception crosses this boundary; every function that can fail returns a
 * geist_status and records a message (see geist_last_error()).
 */
#ifndef GEIST_GEIST_H
#define GEIST_GEIST_H

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. Stable values: new codes are appended, never renumbered. */
typedef enum geist_status {
  GEIST_OK = 0,
  GEIST_E_INVALID_ARGUMENT = 1, /* a NULL pointer, a zero size, a value out of range */
  GEIST_E_IO = 2,               /* the file could not be opened, read or mapped */
  GEIST_E_BAD_FORMAT = 3,       /* the bytes are not a valid GGUF (or snapshot) */
  GEIST_E_UNSUPPORTED = 4,      /* valid, but an architecture/type/version we do not run */
  GEIST_E_OUT_OF_MEMORY = 5,
  GEIST_E_CONTEXT_FULL = 6,     /* more tokens than the session's context holds */
  GEIST_E_BUFFER_TOO_SMALL = 7, /* caller's buffer too small; the needed size is reported */
  GEIST_E_INTERNAL = 8,         /* a bug in geist; the message says where */
  GEIST_E_STATE = 9,            /* the call is not valid in the object's current state */
  GEIST_STATUS_COUNT            /* sentinel, not a status */
} geist_status;

/* Short, static, English name of a status ("GEIST_E_BAD_FORMAT"); never NULL. */
const char *geist_status_name(geist_status s);

#ifdef __cplusplus
}
#endif
#endif /* GEIST_GEIST_H */
