/* geist: run language models locally from GGUF files.
 *
 * Public C ABI. Plain C (C99), usable from C, C++, Python ctypes, Go and Rust.
 *
 * Conventions
 * - No exception or signal crosses this boundary. Every function that can fail returns a
 *   geist_status; GEIST_OK (0) is success.
 * - Errors: a failed call on a session also records its message in the session
 *   (geist_session_error()); every failed call records it in a thread-local slot
 *   (geist_last_error()). Messages are English, one line, and name the problem.
 * - A failed call changes nothing: the model or session is exactly as before the call.
 *   The one exception is a device error (a GPU's fault, named with the device): it takes
 *   the session back to its pin (or empty). On a GPU it may be found by the call after the
 *   one that queued the failed work (geist_session_wait says when); that call returns it,
 *   and geist_session_reset / clear / unpin, which return no device error, still end at the
 *   pin (or empty).
 * - Ownership: objects returned through `**out` belong to the caller and are released
 *   with their *_free function (NULL is accepted and ignored). Pointers returned by
 *   getters stay valid until the next call that changes that object, or its free.
 * - Thread safety: a geist_model is immutable after load; any number of threads may use
 *   it at once (tokenize, create sessions). A geist_session is used by one thread at a
 *   time (it may move between threads); different sessions run concurrently, each on its
 *   own threads, sharing one copy of the weights. A call on a session that another
 *   thread is inside of is refused with GEIST_E_STATE ("in use by another thread"; the
 *   message goes to geist_last_error() only) instead of corrupting it; this guard is not a
 *   lock (the caller must still serialize) and does not cover the size/count getters
 *   or geist_session_free. A session keeps its model alive:
 *   geist_model_free() on a model with live sessions releases it when the last session
 *   is freed.
 * - Params structs: start from geist_*_params_default() and change fields. The structs'
 *   layout is part of the ABI: while the version is 0.x it may change between releases
 *   (fields are appended), and the library's SONAME (libgeist.so.0.x) changes with it, so
 *   build against the header of the library you load.
 * - Token ids are int32 (geist_token); text is UTF-8 bytes with an explicit length.
 */
#ifndef GEIST_GEIST_H
#define GEIST_GEIST_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define GEIST_API __declspec(dllexport)
#elif defined(__GNUC__)
#define GEIST_API __attribute__((visibility("default")))
#else
#define GEIST_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. Stable values: new codes are appended, never renumbered. */
typedef enum geist_status {
  GEIST_OK = 0,
  GEIST_E_INVALID_ARGUMENT = 1, /* a NULL pointer, a zero size, a value out of range */
  GEIST_E_IO = 2,               /* a file could not be opened, read, written or mapped */
  GEIST_E_BAD_FORMAT = 3,       /* the bytes are not a valid GGUF or snapshot (truncated, corrupt) */
  GEIST_E_UNSUPPORTED = 4,      /* valid, but an architecture/type/version geist does not run */
  GEIST_E_OUT_OF_MEMORY = 5,
  GEIST_E_CONTEXT_FULL = 6,     /* more tokens than the session's context holds */
  GEIST_E_BUFFER_TOO_SMALL = 7, /* caller's buffer too small; the needed size is reported */
  GEIST_E_INTERNAL = 8,         /* a bug in geist; the message says where */
  GEIST_E_STATE = 9,            /* the call is not valid in the object's current state */
  GEIST_E_MISMATCH = 10,        /* a snapshot made with another model or KV geometry */
  GEIST_STATUS_COUNT            /* sentinel, not a status */
} geist_status;

typedef int32_t geist_token;
typedef struct geist_model geist_model;
typedef struct geist_session geist_session;

/* Short, static, English name of a status ("GEIST_E_BAD_FORMAT"); never NULL. */
GEIST_API const char *geist_status_name(geist_status s);

/* "0.1.0 (commit abcdef123456)"; static, never NULL. */
GEIST_API const char *geist_version(void);

/* Message of the last failed geist call on this thread ("" if none yet). Valid until the
 * next failing call on the same thread. Never NULL. */
GEIST_API const char *geist_last_error(void);

/* ---------------------------------------------------------------------------------- */
/* Models                                                                             */

/* Parameter structs the caller allocates (geist_model_params, geist_session_params,
 * geist_sampling_params) start with struct_size: get them from the *_default() functions,
 * which set it to the size this header declares, then change the fields you need. A
 * library newer than the header the caller compiled against reads only the fields that
 * fit in struct_size and defaults the rest; an older library refuses a struct larger than
 * it knows (GEIST_E_UNSUPPORTED) rather than ignore fields it cannot honour. A
 * struct_size below the first sized version is GEIST_E_INVALID_ARGUMENT. */

/* Where a model's weights live and its sessions compute. */
typedef enum geist_backend_kind {
  GEIST_BACKEND_CPU = 0,  /* the CPU (SIMD tier from CPUID, GEIST_ISA lowers it) */
  GEIST_BACKEND_CUDA = 1  /* an NVIDIA GPU (a build with -DGEIST_CUDA=ON) */
} geist_backend_kind;

typedef struct geist_model_params {
  uint32_t struct_size; /* sizeof(geist_model_params); set by geist_model_params_default */
  /* 1: ask the kernel to read the weights ahead at load (madvise WILLNEED) so the first
   * request does not pay the page-in. 0: page in on first use. Default 1. */
  int32_t prefetch;
  int32_t backend;      /* a geist_backend_kind. Default GEIST_BACKEND_CPU */
  int32_t device;       /* GPU ordinal for GEIST_BACKEND_CUDA. Default 0 */
} geist_model_params;

GEIST_API geist_model_params geist_model_params_default(void);

/* Map, validate and bind a GGUF file; the weights stay in the mapping (zero-copy).
 * The file must not be truncated or rewritten while the model is loaded: reading a page
 * of a mapped file that was cut short raises SIGBUS in the process (the geist CLI catches
 * it and names the file; the library installs no signal handler).
 * p may be NULL (defaults). On success *out is a new model; on failure *out is NULL.
 * GEIST_E_INVALID_ARGUMENT  path or out NULL
 * GEIST_E_IO                cannot open, stat or map the file
 * GEIST_E_BAD_FORMAT        not a GGUF, truncated, missing or inconsistent keys/tensors
 * GEIST_E_UNSUPPORTED       architecture, tensor type, tokenizer or version not supported
 * GEIST_E_OUT_OF_MEMORY */
GEIST_API geist_status geist_model_load(const char *path, const geist_model_params *p, geist_model **out);

/* As geist_model_load over a caller-owned buffer holding a whole GGUF file. No copy of
 * the weights is made: the caller keeps data alive and unchanged until the model and all
 * its sessions are freed. The buffer must be
 * at least 4-byte aligned (malloc and mmap give more); a misaligned buffer is refused with
 * GEIST_E_BAD_FORMAT naming the tensor. Same statuses (size 0 / data NULL:
 * GEIST_E_INVALID_ARGUMENT). */
GEIST_API geist_status geist_model_load_from_memory(const void *data, size_t size, const geist_model_params *p,
                                                    geist_model **out);

/* Release the caller's reference; the model goes once its last session is freed. */
GEIST_API void geist_model_free(geist_model *m);

typedef struct geist_model_info {
  const char *arch;      /* general.architecture ("gemma3"); valid while the model lives */
  const char *name;      /* general.name, "" if absent */
  int64_t n_vocab;       /* logits per position */
  int64_t n_ctx_train;   /* trained context length */
  int64_t n_embd;
  int64_t n_layer;
  int64_t n_params;      /* elements of all tensors */
  uint64_t file_size;    /* bytes of the GGUF */
  uint64_t fingerprint;  /* hash of the GGUF's metadata and tensor table (snapshot identity) */
  geist_token bos;       /* -1 if the vocabulary has none */
  geist_token eos;       /* -1 if none */
  geist_token eot;       /* end-of-turn token, -1 if none */
  int32_t add_bos;       /* 1 if geist_tokenize(add_bos=1) prepends BOS for this vocabulary */
  double load_seconds;   /* time geist_model_load took */
} geist_model_info;

/* GEIST_E_INVALID_ARGUMENT if m or out is NULL. */
GEIST_API geist_status geist_model_get_info(const geist_model *m, geist_model_info *out);

/* Where a model runs: its backend and device, and for the CPU the ISA tier chosen at start
 * (CPUID + XGETBV, or GEIST_ISA=generic|avx2|avx2vnni|avx512 where the CPU supports it). */
typedef struct geist_backend_info {
  const char *isa;         /* "avx512", "avx2vnni", "avx2" or "generic"; static storage */
  const char *isa_detail;  /* e.g. "avx512 (F BW DQ VL VNNI BF16)"; valid while the model lives */
  const char *isa_best;    /* the highest tier this CPU supports; static storage */
  uint64_t packed_bytes;   /* bytes the backend holds for the weights: repacked on the CPU (0
                            * on the generic tier), device memory on a GPU */
  double repack_seconds;   /* time preparing them took (part of load_seconds) */
  const char *backend;     /* "cpu" or "cuda"; valid while the model lives */
  const char *device;      /* the device in words; valid while the model lives */
} geist_backend_info;

/* GEIST_E_INVALID_ARGUMENT if m or out is NULL. */
GEIST_API geist_status geist_model_get_backend(const geist_model *m, geist_backend_info *out);

/* Text to token ids. add_bos: prepend BOS if the model has one. parse_special: text like
 * "<start_of_turn>" becomes its control token; otherwise it is plain text.
 * out may be NULL when cap is 0 (size query). *n_out is always set on OK and on
 * GEIST_E_BUFFER_TOO_SMALL (then it is the number needed and out is untouched).
 * GEIST_E_INVALID_ARGUMENT  m or n_out NULL, text NULL with len > 0, out NULL with cap > 0 */
GEIST_API geist_status geist_tokenize(const geist_model *m, const char *text, size_t len, int add_bos,
                                      int parse_special, geist_token *out, size_t cap, size_t *n_out);

/* The bytes of one token's text (control tokens render as their text, e.g. "<bos>";
 * byte-fallback tokens give that single byte, so a piece may be a partial UTF-8
 * sequence). Not NUL-terminated. *n_out is the length (needed length on
 * GEIST_E_BUFFER_TOO_SMALL). buf may be NULL when cap is 0.
 * GEIST_E_INVALID_ARGUMENT  m or n_out NULL, t outside [0, n_vocab) */
GEIST_API geist_status geist_token_to_piece(const geist_model *m, geist_token t, char *buf, size_t cap,
                                            size_t *n_out);

/* Token ids back to UTF-8 text, as a reader sees it: control tokens dropped unless
 * render_special, byte-fallback bytes joined, ill-formed bytes as U+FFFD, SPM's leading
 * space of the first piece kept. Sizes as geist_tokenize. */
GEIST_API geist_status geist_detokenize(const geist_model *m, const geist_token *t, size_t n, int render_special,
                                        char *buf, size_t cap, size_t *n_out);

/* 1 if t ends a generation (EOS, end-of-turn and the like), else 0 (also for bad ids). */
GEIST_API int geist_token_is_eog(const geist_model *m, geist_token t);

/* ---------------------------------------------------------------------------------- */
/* Sessions                                                                           */

typedef struct geist_sampling_params {
  uint32_t struct_size;   /* sizeof(geist_sampling_params); set by geist_sampling_params_default */
  float temperature;      /* <= 0: greedy (argmax, ties to the lowest id). Default 0.8 */
  int32_t top_k;          /* <= 0: off. Default 40 */
  float top_p;            /* in [0, 1]; 1: off. Default 0.95 */
  float min_p;            /* in [0, 1]; 0: off. Default 0.05 */
  float repeat_penalty;   /* 1: off, must be > 0. Default 1 */
  int32_t repeat_last_n;  /* tokens the penalty looks back; 0 off, -1 all. Default 64 */
  uint64_t seed;          /* RNG seed. Default 0xC0FFEE */
} geist_sampling_params;

/* Element type of the KV cache (llama.cpp's -ctk/-ctv names: f32 f16 bf16 q8_0). f32 is
 * exact; f16 and bf16 halve the cache, q8_0 (blocks of 32 with an f16 scale) takes
 * 34/128 of f32. Rows are rounded once, when they are stored. */
typedef enum geist_kv_type {
  GEIST_KV_F32 = 0,
  GEIST_KV_F16 = 1,
  GEIST_KV_BF16 = 2,
  GEIST_KV_Q8_0 = 3
} geist_kv_type;

typedef struct geist_session_params {
  uint32_t struct_size; /* sizeof(geist_session_params); set by geist_session_params_default */
  int32_t n_threads;  /* threads of this session's compute, counting the caller; 0: all cores.
                         Sessions asking for the same count share one set of worker threads.
                         On a GPU the host uses up to 4 of them when several sessions
                         sample in one step (geist_decode_batch, geist_step_batch) */
  int64_t n_ctx;      /* context in tokens; 0: the model's trained context (no hidden cap). */
  int32_t chunk;      /* rows per forward pass; prefill of any length runs in these. Default 256 */
  int32_t type_k;     /* a geist_kv_type for K rows. Default GEIST_KV_F32 */
  int32_t type_v;     /* a geist_kv_type for V rows. Default GEIST_KV_F32 */
  int32_t reserved;   /* 0 */
  geist_sampling_params sampling; /* last: it may grow too */
} geist_session_params;

GEIST_API geist_sampling_params geist_sampling_params_default(void);
GEIST_API geist_session_params geist_session_params_default(void);

/* A new, empty session over m (which it keeps alive). KV memory is reserved, not
 * committed: pages are used as positions fill, so a large n_ctx costs address space only.
 * GEIST_E_INVALID_ARGUMENT  m or out NULL; n_ctx < 0 or > 2^24; chunk outside [1, 65536];
 *                           n_threads outside [0, 512]; sampling values out of range;
 *                           type_k/type_v not a geist_kv_type
 * GEIST_E_UNSUPPORTED       q8_0 rows of a width that is not a multiple of 32
 * GEIST_E_OUT_OF_MEMORY     the KV cache or scratch cannot be reserved */
GEIST_API geist_status geist_session_create(geist_model *m, const geist_session_params *p, geist_session **out);
GEIST_API void geist_session_free(geist_session *s);

/* Message of this session's last failed call, "" if none. Valid until the next call on s. */
GEIST_API const char *geist_session_error(const geist_session *s);

/* Append n >= 1 tokens (run in chunks of the configured size) and compute the logits
 * after the last one. The tokens enter the sampler's repetition history.
 * GEIST_E_INVALID_ARGUMENT  s or t NULL, n 0, a token id outside [0, n_vocab)
 * GEIST_E_CONTEXT_FULL      n_tokens + n > n_ctx
 * GEIST_E_OUT_OF_MEMORY */
GEIST_API geist_status geist_session_prefill_tokens(geist_session *s, const geist_token *t, size_t n);

/* As prefill_tokens, and also copy the logits after every token i in [first, n) to
 * out[(i - first) * n_vocab ...]; out holds (n - first) * n_vocab floats (cap counts floats).
 * Extra statuses: GEIST_E_INVALID_ARGUMENT for first >= n or out NULL,
 * GEIST_E_BUFFER_TOO_SMALL if cap < (n - first) * n_vocab (nothing is computed). */
GEIST_API geist_status geist_session_prefill_logits(geist_session *s, const geist_token *t, size_t n, size_t first,
                                                    float *out, size_t cap);

/* Clear the session, prefill t[0..n), and pin that state: its tokens, the logits after
 * the last one, the sampler state and a checkpoint of the sliding-window layers' last
 * W-1 rows (the only rows a later prefill can overwrite that the pin still needs).
 * Its cost is that of a prefill of n tokens plus that copy. Replaces an earlier pin.
 * Statuses of prefill_tokens (checked before anything is cleared). */
GEIST_API geist_status geist_session_pin_prefix(geist_session *s, const geist_token *t, size_t n);

/* Drop the pin (n_pinned becomes 0); the tokens stay. GEIST_E_INVALID_ARGUMENT if s NULL. */
GEIST_API geist_status geist_session_unpin(geist_session *s);

/* Back to the pinned state exactly (tokens, logits, sampler RNG and history, sliding
 * rows), or to empty if nothing is pinned. The sampling params stay the current ones
 * (call geist_session_set_sampling after a reset for a per-request seed). Decode may follow directly. Cost: O(1) plus copying back the
 * checkpoint rows that later tokens overwrote (none if the request after the pin was at
 * most `chunk` tokens long). GEIST_E_INVALID_ARGUMENT if s NULL. */
GEIST_API geist_status geist_session_reset(geist_session *s);

/* Empty the session and drop the pin. GEIST_E_INVALID_ARGUMENT if s NULL. */
GEIST_API geist_status geist_session_clear(geist_session *s);

/* Sample a token from the current logits (session sampling params), append it, and
 * compute the logits after it. *out is the token (it may be an end-of-generation token:
 * check geist_token_is_eog and stop). Batch invariant: the logits equal those of a
 * prefill of the same tokens.
 * GEIST_E_INVALID_ARGUMENT  s or out NULL
 * GEIST_E_STATE             no logits yet (empty session)
 * GEIST_E_CONTEXT_FULL      the context has no room for one more token */
GEIST_API geist_status geist_session_decode_step(geist_session *s, geist_token *out);

/* On a GPU a session's decode step may return once its forward pass is queued, where the
 * step draws the next token itself (greedy; sampling with top_k 1..256 and no repeat
 * penalty too where the backend draws it, as CUDA does unless GEIST_CUDA_SAMPLE=0: the
 * same token the host would draw): the next
 * decode step takes the token from it on the device, so the host prepares each step
 * while the device runs the one before, and any call that reads or changes the session's
 * state (logits, snapshot, prefill, reset, ...) waits for it first; so does freeing it.
 * geist_session_wait waits for it now (to time a run, or before the thread leaves the
 * session idle); GEIST_OK at once when nothing is queued (always on the CPU). A device error
 * found here takes the session back to its pin (or empty), as the step's own call would
 * have. GEIST_E_INVALID_ARGUMENT if s NULL. */
GEIST_API geist_status geist_session_wait(geist_session *s);

/* geist_session_decode_step for n sessions of one model in a single forward step: the
 * weights are read once for all of them, which is how a server decodes many requests at
 * once. out[i] is session i's token. Each session samples from its own logits with its
 * own sampling params, and its new logits are bit-identical to a decode_step of it alone.
 * The step runs on sessions[0]'s buffers, so n is at most that session's chunk
 * (geist_session_params.chunk). The calling thread holds every session for the call.
 * Checked before anything changes:
 * GEIST_E_INVALID_ARGUMENT  sessions or out NULL, n 0, a NULL or repeated session, sessions
 *                           of different models, n above the chunk
 * GEIST_E_STATE             a session without logits, or in use by another thread
 * GEIST_E_CONTEXT_FULL      a session whose context has no room for one more token
 * A device error takes every session back to its pin (or empty), as decode_step does. */
GEIST_API geist_status geist_decode_batch(geist_session *const *sessions, size_t n, geist_token *out);

/* One forward step for n sessions of one model, each prefilling a chunk or decoding (what
 * a server's continuous batching runs): where n_tokens[i] > 0, session i appends
 * tokens[i][0 .. n_tokens[i]) as geist_session_prefill_tokens does; where n_tokens[i] is
 * 0 it samples a token, appends it, and out[i] is that token, as
 * geist_session_decode_step does (tokens[i] is not read; tokens may be NULL if every count
 * is 0). The weights are read once for the step, and every session's new logits are
 * bit-identical to that prefill or decode step alone. The rows, the sum of
 * max(n_tokens[i], 1), are at most sessions[0]'s chunk. out[i] of a prefilling session is
 * not written. The calling thread holds every session for the call.
 * Checked before anything changes: geist_decode_batch's errors, and for a chunk
 * GEIST_E_INVALID_ARGUMENT (no tokens, an id outside the vocabulary) or
 * GEIST_E_CONTEXT_FULL (no room for it). A device error takes every session back to its
 * pin (or empty). */
GEIST_API geist_status geist_step_batch(geist_session *const *sessions, const geist_token *const *tokens,
                                        const size_t *n_tokens, size_t n, geist_token *out);

/* Sample a token from the current logits without appending it (the RNG advances and the
 * token enters the repetition history). GEIST_E_STATE if there are no logits. */
GEIST_API geist_status geist_session_sample(geist_session *s, geist_token *out);

/* Replace the sampling params (the RNG is reseeded from p->seed; history kept).
 * The repetition history holds the last repeat_last_n tokens that were prefilled,
 * decoded or sampled; it is trimmed to the current repeat_last_n, so a session restored
 * from a snapshot made with a smaller window has a shorter history than a fresh prefill.
 * GEIST_E_INVALID_ARGUMENT for NULL or out-of-range values. */
GEIST_API geist_status geist_session_set_sampling(geist_session *s, const geist_sampling_params *p);

/* Logits after the last token ([n_vocab] floats, owned by the session, valid until the
 * next call that changes s), or NULL if the session has none (empty, or s NULL), and NULL
 * with geist_last_error() set when the row could not be copied from the device or another
 * thread is inside s. *n_vocab is set when n_vocab is not NULL (0 when NULL is returned). */
GEIST_API const float *geist_session_logits(const geist_session *s, size_t *n_vocab);

GEIST_API size_t geist_session_n_tokens(const geist_session *s); /* 0 for NULL */
GEIST_API size_t geist_session_n_pinned(const geist_session *s); /* 0 for NULL or no pin */
GEIST_API size_t geist_session_n_ctx(const geist_session *s);    /* 0 for NULL */
GEIST_API size_t geist_session_n_vocab(const geist_session *s);  /* logits per position; 0 for NULL */
GEIST_API int32_t geist_session_n_threads(const geist_session *s); /* threads in use (0 resolved); 0 for NULL */
GEIST_API int32_t geist_session_chunk(const geist_session *s);     /* chunk in use (clamped to n_ctx); 0 for NULL */

/* The session's tokens: copies n_tokens ids to out, *n_out = n_tokens.
 * GEIST_E_BUFFER_TOO_SMALL if cap < n_tokens (nothing copied; *n_out is set).
 * GEIST_E_INVALID_ARGUMENT for s or n_out NULL, or out NULL with cap > 0. */
GEIST_API geist_status geist_session_tokens(const geist_session *s, geist_token *out, size_t cap, size_t *n_out);

/* Snapshots: a versioned, checksummed image of the whole session state: model
 * fingerprint, KV geometry, tokens, pin, the KV rows in use (for sliding layers only the
 * window's last W-1 rows), the pin's checkpoint, logits, sampler RNG and history. A
 * snapshot restores into any session of the same model whose n_ctx holds its tokens
 * (chunk and thread count may differ); the logits that follow are bit-identical.
 * The format is documented in docs/SNAPSHOT.md. */

/* Bytes geist_session_snapshot will write now. GEIST_E_INVALID_ARGUMENT for NULLs. */
GEIST_API geist_status geist_session_snapshot_size(const geist_session *s, size_t *size);

/* Write the image to buf. *written is its size (also on GEIST_E_BUFFER_TOO_SMALL, when
 * nothing is written). GEIST_E_INVALID_ARGUMENT for NULLs (buf may be NULL if cap 0). */
GEIST_API geist_status geist_session_snapshot(const geist_session *s, void *buf, size_t cap, size_t *written);

/* Replace the session's state with an image. Everything is validated before the session
 * is touched; on any error it is unchanged.
 * GEIST_E_INVALID_ARGUMENT  s or buf NULL
 * GEIST_E_BAD_FORMAT        not a geist snapshot, truncated, checksum mismatch, inconsistent
 * GEIST_E_UNSUPPORTED       a snapshot version this build does not read
 * GEIST_E_MISMATCH          made with another model (fingerprint) or KV geometry
 * GEIST_E_CONTEXT_FULL      its tokens do not fit this session's n_ctx
 * GEIST_E_OUT_OF_MEMORY */
GEIST_API geist_status geist_session_restore(geist_session *s, const void *buf, size_t size);

/* Snapshot to / restore from a file. save_file writes PATH.tmp.<pid>, fsyncs it and
 * renames it over PATH, so neither a crash nor a concurrent saver leaves a half file under
 * PATH. Statuses of snapshot/restore, plus GEIST_E_IO. */
GEIST_API geist_status geist_session_save_file(const geist_session *s, const char *path);
GEIST_API geist_status geist_session_load_file(geist_session *s, const char *path);

/* Saved states: a session's state kept in memory for a later load into any session of the
 * same model, with its KV rows where the session keeps its KV cache (device memory for a
 * GPU session). What a snapshot holds, neither serialised nor checksummed nor moved off
 * the device: saving and loading are copies inside the device. This is what a prefix
 * cache should keep (geist serve does); a snapshot is for files and other processes.
 * A state is reused by later saves: its memory grows when a save needs more, else is kept.
 * Several threads may load from (or snapshot) one state at once; a save into a state
 * that another thread is reading, or the reverse, is refused with GEIST_E_STATE. */
typedef struct geist_state geist_state;

/* An empty state (no memory beyond the handle until the first save). GEIST_E_INVALID_ARGUMENT
 * for out NULL, GEIST_E_OUT_OF_MEMORY. */
GEIST_API geist_status geist_state_create(geist_state **out);
GEIST_API void geist_state_free(geist_state *st); /* NULL is a no-op */

/* Bytes a state saved from s now needs, for a cache to make room first or to pick a state
 * to reuse (one whose geist_state_bytes is at least this). A fresh state holds up to 1/8
 * more: its KV buffer is rounded up, so that a slightly longer save reuses it.
 * GEIST_E_INVALID_ARGUMENT for NULLs. */
GEIST_API geist_status geist_session_state_bytes(const geist_session *s, size_t *bytes);
/* Save s's state into st, replacing what it held. On an error st is unchanged.
 * GEIST_E_INVALID_ARGUMENT for NULLs, GEIST_E_OUT_OF_MEMORY when the state's KV rows do not
 * fit (device memory for a GPU session), GEIST_E_STATE when st is in use by another thread. */
GEIST_API geist_status geist_session_save_state(const geist_session *s, geist_state *st);
/* Replace s's state with st's, exactly as geist_session_restore of the state's snapshot
 * would (the same checks and guarantee: on any error s is unchanged; the logits that follow
 * are bit-identical). GEIST_E_STATE for an empty state (or one another thread is saving
 * into), GEIST_E_MISMATCH for another model, KV geometry or KV types, or a state whose rows
 * are in another device's memory (a GPU session's state and a CPU session),
 * GEIST_E_CONTEXT_FULL when its tokens do not fit s's n_ctx. */
GEIST_API geist_status geist_session_load_state(geist_session *s, const geist_state *st);

/* Memory the state holds, host and device, in bytes; 0 for NULL or while being saved into. */
GEIST_API size_t geist_state_bytes(const geist_state *st);
/* The state's tokens, as geist_session_tokens. */
GEIST_API geist_status geist_state_tokens(const geist_state *st, geist_token *out, size_t cap, size_t *n_out);
/* The snapshot image of the state (docs/SNAPSHOT.md), byte for byte what
 * geist_session_snapshot of its session wrote at the save; copies the KV rows to the host
 * (for a file: a disk tier of a cache). GEIST_E_STATE for an empty state, otherwise as
 * geist_session_snapshot_size / geist_session_snapshot. */
GEIST_API geist_status geist_state_snapshot_size(const geist_state *st, size_t *size);
GEIST_API geist_status geist_state_snapshot(const geist_state *st, void *buf, size_t cap, size_t *written);

/* GEIST_OK if geist_session_save_file may write path: the rule above, and path's
 * directory takes a new file (probed without leaving anything). Otherwise GEIST_E_IO and
 * a message saying why (geist_last_error). Lets an application refuse a bad path before
 * it does any work. Changes nothing. */
GEIST_API geist_status geist_snapshot_file_check(const char *path);

/* A struct tag, not a typedef: the function below has the same name (C keeps tags in
 * their own namespace). Use `struct geist_session_stats` or geist_session_stats_t. */
struct geist_session_stats {
  uint64_t n_prefill_tokens;  /* tokens run by prefill_tokens/prefill_logits (pins excluded) */
  double prefill_seconds;
  uint64_t n_decode_tokens;   /* decode_step calls that succeeded */
  double decode_seconds;      /* sampling + forward: time inside decode calls, and in waits for a
                                 queued step (geist_session_wait); work the device does while
                                 the caller is elsewhere is not in it (time the caller's loop
                                 for throughput) */
  uint64_t n_pins;
  uint64_t n_pinned_tokens;   /* tokens prefilled by pin_prefix, summed */
  double pin_seconds;         /* prefill + checkpoint copy */
  uint64_t n_resets;
  double reset_seconds;
  uint64_t n_reset_rows;      /* checkpoint rows copied back by resets, summed */
  uint64_t n_snapshots;
  double snapshot_seconds;
  uint64_t n_restores;
  double restore_seconds;
  uint64_t kv_bytes_reserved; /* address space of the KV cache */
  uint64_t checkpoint_bytes;  /* held by the pin's sliding-window checkpoint */
  double last_prefill_seconds; /* the most recent prefill_tokens/prefill_logits call */
  double last_decode_seconds;  /* the most recent decode_step */
  uint64_t scratch_bytes;     /* held for activations and step staging: device memory on a
                               * GPU (the captured graphs' own memory is the driver's and not
                               * counted), host memory on the CPU. Neither KV nor weights
                               * (geist_backend_info.packed_bytes). Set at create and by the
                               * first steps that need more, then fixed. */
};
typedef struct geist_session_stats geist_session_stats_t;

/* Counters of this session since create (a restore counts as a restore; it does not
 * bring counters from the image). GEIST_E_INVALID_ARGUMENT for NULLs. */
GEIST_API geist_status geist_session_stats(const geist_session *s, struct geist_session_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* GEIST_GEIST_H */
